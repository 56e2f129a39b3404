"""`ActorGroup`: the seam between the PPO loop and wherever the trainable weights live.

The loop (`ppo_trainer.py`) talks to one `ActorGroup` and never asks which kind it is. An actor
group owns the actor (the trained model and its training engine), the reference policy (the
actor with LoRA disabled) and the rollout engine that samples with the actor's weights:

| call                         | does                                                              |
|------------------------------|-------------------------------------------------------------------|
| `model`                      | the driver's view of the model: tokenizer, processor, shapes (what |
|                              | building requests needs); on Ray a weightless meta-device copy    |
| `rollout_engine`             | a `RolloutEngine` sampling with the actor's current weights       |
| `rollout_is_behaviour_policy`| whether the rollout's log-probs are the actor's own (the same     |
|                              | function: then the old log-probs need no recompute; equal to it   |
|                              | up to float32 rounding where the batch shapes differ)             |
| `behaviour_policy(batch)`    | the batch scored under the current weights (`BehaviourPolicy`)   |
| `update(batch, step)`        | one PPO update (epochs x mini-batches); the step's metrics        |
| `sync_rollout(version)`      | the rollout engine takes the actor's weights, tagged `version`    |
| `weights_snapshot(version)`  | detached copies of the trainable tensors (`WeightSnapshot`), for   |
|                              | a pipelined producer (`trainer.pipeline`) to load between rollouts |
| `save(dir, step, yaml, pipeline)` | a checkpoint folder (atomic), with the producer's in-flight  |
|                              | units (`PipelineState`); `load(state)` resumes from one           |
| `export(folder)`             | the trained weights (LoRA or full) in the model library's format  |
|                              | (and, with an EMA of them, the EMA's in `folder/ema/`)             |
| `validation_weights()`       | which weights validation samples with: ("trained",), ("ema",) or   |
|                              | both, in that order (an EMA only where the backend keeps one)      |
| `sampling_with(which, engine)` | a context inside which `engine` samples with those weights      |
| `set_step(step)`, `close()`  | the step a failure is reported at; release everything             |

Backends register their group class in `ACTOR_GROUPS` under the name `trainer.backend` takes
(`local`: this process; `ray`: a Ray worker group running FSDP2) and declare the training
engines they drive (`engines`, the first being the default for `trainer.engine: null`) and the
config rules that are theirs alone (`check_config`, at load time), and their options
(`options_class`, set under `trainer.backend_options`). A new backend (a process
pool, say) is one registered class: no file of the loop changes.
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
