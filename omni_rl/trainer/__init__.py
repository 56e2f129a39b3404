"""The PPO loop (`ppo_trainer`) and the ActorGroup seam it talks to (`actor_group`).

Importing this package registers the two backends `trainer.backend` selects: `local`
(`local_actors.LocalActorGroup`, this process) and `ray` (`ray_actors.RayActorGroup`, Ray
workers running FSDP2; Ray itself is imported only when one is built).
"""
from omni_rl.trainer import local_actors, ray_actors  # noqa: F401  (register the backends)
from omni_rl.trainer.actor_group import ACTOR_GROUPS, ActorGroup, register_backend
from omni_rl.trainer.ppo_trainer import PPOTrainer, run

__all__ = ["ACTOR_GROUPS", "ActorGroup", "PPOTrainer", "register_backend", "run"]
