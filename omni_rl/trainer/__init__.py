"""The PPO trainer loop and its stages."""
from omni_rl.trainer.ppo_trainer import PPOTrainer, run

__all__ = ["PPOTrainer", "run"]
