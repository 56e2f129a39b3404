"""`TRAINING_ENGINES`: `trainer.engine` names a `TrainingEngineSpec`, which builds a training engine.

One signature, `spec.build(model, cfg) -> TrainingEngine`, called where the actor's weights live:
`local` (one process) or `fsdp2` (one per rank, imported only when built). Each spec declares its
options class (`trainer.engine_options`, bound at load); which engines a backend drives, the backend says.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from omni_rl.config.options import NoOptions
from omni_rl.option import ComponentOptions, option
from omni_rl.config.schema import OmniConfig
from omni_rl.engine.base import TrainingEngine
from omni_rl.registry import Registry


@dataclass(frozen=True)
class TrainingEngineSpec:
    """A registered training engine: its builder and its options dataclass."""

    build: Callable[..., TrainingEngine]
    options_class: type = NoOptions


TRAINING_ENGINES: Registry[TrainingEngineSpec] = Registry("training engine")


def register_engine(name: str, options_class: type = NoOptions):
    """Decorator: register `build(model, cfg) -> TrainingEngine` as engine `name`."""
    def decorator(build):
        TRAINING_ENGINES.register(name, TrainingEngineSpec(build, options_class))
        return build

    return decorator


def build_engine(model, cfg: OmniConfig) -> TrainingEngine:
    return TRAINING_ENGINES.get(cfg.trainer.engine).build(model, cfg)


@dataclass
class FSDP2Options(ComponentOptions):
    """FSDP2's offload switches (`trainer.engine_options`)."""

    param_offload: bool = option(False, "FSDP2 CPUOffloadPolicy: sharded parameters (and their gradients) live in host memory.")
    optimizer_offload: bool = option(False, "Keep the optimizer's state in host memory between steps (moved to the device to step).")


@register_engine("local")
def local_engine(model, cfg: OmniConfig) -> TrainingEngine:
    from omni_rl.engine.local import LocalEngine

    return LocalEngine(model, cfg.optim)


@register_engine("fsdp2", FSDP2Options)
def fsdp2_engine(model, cfg: OmniConfig) -> TrainingEngine:
    from omni_rl.engine.fsdp2 import FSDP2Engine  # needs torch.distributed: only where it runs

    options = cfg.trainer.engine_options
    return FSDP2Engine(model, cfg.optim, options.param_offload, options.optimizer_offload)
