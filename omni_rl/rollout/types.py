"""Requests and results of diffusion rollout engines.

One request is one sample: its own prompt, seed, step count, guidance and SDE window. Everything
random about a sample comes from a generator seeded by the request alone, so its trajectory is
the same whether it ran alone or packed with other requests.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch

from omni_rl.models.conditioning import Conditioning

_ids = itertools.count()


@dataclass
class DiffusionRequest:
    prompt: str
    seed: int
    height: int
    width: int
    num_steps: int
    guidance_scale: float
    kernel: str = "sde"
    noise_level: float = 0.7
    # 1 = an image; video models take their own frame counts (Wan: 4k+1). fps is the
    # playback rate of the frames (what the model is conditioned on, where it is, and the videos).
    num_frames: int = 1
    fps: float = 16.0
    # Stochastic (and trained) steps: `sde_window_size` consecutive steps whose first step is
    # drawn from the seed in [lo, hi - size]; 0 = every step. `sde_window_range` null = [0, num_steps).
    sde_window_size: int = 0
    sde_window_range: Optional[tuple[int, int]] = None
    negative_prompt: str = ""
    # Explicit initial noise (one sample's latent shape); drawn from the seed when None.
    initial_noise: Optional[torch.Tensor] = None
    # The seed of the initial noise when a group shares it (DanceGRPO's same_noise_in_group):
    # drawn by the engine from its own generator seeded with it, so a group's requests carry an
    # int, not a latent each. None = drawn from `seed` (or `initial_noise`, which wins).
    noise_seed: Optional[int] = None
    # Condition images of an editing model (`DiffusionModelBase.takes_source_image`): uint8
    # [H, W, 3] tensors at the size the model encodes them (`condition_images`); None for
    # text-to-image. The engine encodes them with the prompt (`encode_prompts(..., images=)`).
    images: Optional[tuple[torch.Tensor, ...]] = None
    # Precomputed prompt embeddings (batch of 1); the engine encodes the prompt when None.
    conditioning: Optional[Conditioning] = None
    decode: bool = True
    request_id: int = field(default_factory=lambda: next(_ids))

    def batch_key(self) -> tuple:
        """Requests with equal keys may share a transformer forward."""
        return (self.height, self.width, self.num_frames, float(self.fps), self.num_steps,
                float(self.guidance_scale), self.kernel)


@dataclass
class DiffusionResult:
    """One finished sample. Window tensors are fp32 and cover the steps [start, stop).

    latents:    [W + 1, *latent_shape]  x at each window step, then x after the last one
    log_probs:  [W]  log-density of each window transition (see omni_rl.algos.flow_sde)
    sigmas:     [W]  sigma at each window step;  sigmas_next: [W]
    noise_levels: [W]
    final_latent: [*latent_shape]  the clean latent after all steps
    image:      uint8 pixels, channels last: [H, W, C], or [T, H, W, C] for a video (None
                when the request asked for no decode)
    """

    request_id: int
    prompt: str
    window: tuple[int, int]
    latents: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor
    sigmas_next: torch.Tensor
    noise_levels: torch.Tensor
    final_latent: torch.Tensor
    conditioning: Conditioning
    image: Optional[torch.Tensor]
    guidance_scale: float
    kernel: str
    fps: float = 16.0
    # Sound of audio-video models: float waveform [channels, samples] at sample_rate.
    audio: Optional[torch.Tensor] = None
    sample_rate: Optional[int] = None
    # The engine's weight_version when the sample finished (None: an engine that does not say).
    weight_version: Optional[int] = None
