"""omni-rl: reinforcement-learning post-training for diffusion and omni-modal models."""

__version__ = "0.1.0"
