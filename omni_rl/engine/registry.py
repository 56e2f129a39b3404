"""`TRAINING_ENGINES`: `trainer.engine` names the factory that builds a training engine.

One signature: `factory(model, cfg: OmniConfig) -> TrainingEngine`, called where the actor's
weights live. `local` is one process; `fsdp2` shards over a torch.distributed group (each Ray
worker runs one), imported only when built. Which engines a backend can drive, and its default,
the backend says (`ActorGroup.engines`).
"""
from __future__ import annotations

from omni_rl.config.schema import OmniConfig
from omni_rl.engine.base import TrainingEngine
from omni_rl.registry import Registry

TRAINING_ENGINES: Registry = Registry("training engine")


def register_engine(name: str):
    return TRAINING_ENGINES.register(name)


def build_engine(model, cfg: OmniConfig) -> TrainingEngine:
    return TRAINING_ENGINES.get(cfg.trainer.engine)(model, cfg)


@register_engine("local")
def local_engine(model, cfg: OmniConfig) -> TrainingEngine:
    from omni_rl.engine.local import LocalEngine

    return LocalEngine(model, cfg.optim)


@register_engine("fsdp2")
def fsdp2_engine(model, cfg: OmniConfig) -> TrainingEngine:
    from omni_rl.engine.fsdp2 import FSDP2Engine  # needs torch.distributed: only where it runs

    t = cfg.trainer
    return FSDP2Engine(model, cfg.optim, t.param_offload, t.optimizer_offload)
