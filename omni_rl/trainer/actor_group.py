"""`ActorGroup`: the seam between the PPO loop and wherever the trainable weights live.

The loop (`ppo_trainer.py`) talks to one `ActorGroup` and never asks which kind it is. A group
owns the actor (the trained model and its engine), the reference policy (LoRA off) and the
rollout engine sampling with the actor's weights. Its calls: `model` (the driver's view; a
meta-device copy on Ray), `rollout_engine`, `rollout_is_behaviour_policy`, `behaviour_policy`,
`update`, `sync_rollout`, `weights_snapshot`, `save` / `load`, `export`, `validation_weights`,
`sampling_with`, `set_step`, `close`. Backends register their class in `ACTOR_GROUPS` under a
`trainer.backend` name (`local`, `ray`) and declare their engines, their config rules
(`check_config`) and their options (`options_class`): a new backend changes no file of the loop.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, ContextManager

from omni_rl.config.options import NoOptions
from omni_rl.config.schema import OmniConfig
from omni_rl.families.base import BehaviourPolicy
from omni_rl.registry import Registry
from omni_rl.rollout.base import RolloutEngine


class ActorGroup(ABC):
    # Training engines this backend drives; the first is the default.
    engines: ClassVar[tuple[str, ...]] = ()
    # The backend's options (`trainer.backend_options`), checked at load by `omni_rl.compose`.
    options_class: ClassVar[type] = NoOptions

    model: Any
    rollout_engine: RolloutEngine

    @classmethod
    def check_options_block(cls, cfg: OmniConfig) -> None:
        """Raise `ConfigError` for keys of the recipe's `trainer.backend_options` mapping that belong
        to another backend, before the block is bound (called at config load; none by default)."""

    @classmethod
    def check_config(cls, cfg: OmniConfig) -> None:
        """Raise `ConfigError` for settings this backend cannot run (called at config load, with
        `trainer.backend_options` bound)."""

    @property
    @abstractmethod
    def rollout_is_behaviour_policy(self) -> bool:
        ...

    @abstractmethod
    def behaviour_policy(self, batch) -> BehaviourPolicy:
        ...

    @abstractmethod
    def update(self, batch, step: int) -> dict[str, float]:
        ...

    @abstractmethod
    def sync_rollout(self, version: int) -> None:
        ...

    def weights_snapshot(self, version: int):
        """A `WeightSnapshot` of the trainable tensors now (`omni_rl.trainer.pipeline`)."""
        raise NotImplementedError(f"{type(self).__name__} runs trainer.pipeline=on_policy only")

    @abstractmethod
    def save(self, output_dir: Path, step: int, config_yaml: str, pipeline=None) -> Path:
        ...

    @abstractmethod
    def load(self, state: dict[str, Any]) -> None:
        ...

    @abstractmethod
    def export(self, folder: Path) -> None:
        ...

    def validation_weights(self) -> tuple[str, ...]:
        """The weights validation samples with, each once, in order ("trained", "ema")."""
        return ("trained",)

    def sampling_with(self, which: str, engine) -> ContextManager[None]:
        """Inside, `engine` (the group's rollout engine) samples with the `which` weights of
        `validation_weights()`; after, with the weights it had."""
        if which != "trained":
            raise ValueError(f"{type(self).__name__} keeps only the trained weights, not {which!r}")
        return contextlib.nullcontext()

    def set_step(self, step: int) -> None:
        pass

    @abstractmethod
    def close(self) -> None:
        ...


ACTOR_GROUPS: Registry[type[ActorGroup]] = Registry("trainer backend")


def register_backend(name: str):
    """Class decorator: an `ActorGroup` that `trainer.backend=name` selects."""
    return ACTOR_GROUPS.register(name)
