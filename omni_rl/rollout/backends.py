"""`ROLLOUT_BACKENDS`: `rollout.backend` names the factory that builds a rollout engine.

One signature: `factory(cfg: OmniConfig, model) -> RolloutEngine`, called wherever a model that
samples lives (this process, or each Ray worker's rollout copy). `native` is the in-process
engine of the model's kind: request-level batching for diffusion, batched decoding for text;
`server` runs that engine in a process (and Python, `rollout.python`) of its own, over HTTP.
Register another with `@register_rollout_backend("name")` in a plugin module.
"""
from __future__ import annotations

from omni_rl.config.schema import OmniConfig
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.registry import Registry
from omni_rl.rollout.base import RolloutEngine
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.server.client import start_server_engine
from omni_rl.rollout.text_native import NativeTextEngine

ROLLOUT_BACKENDS: Registry = Registry("rollout backend")


def register_rollout_backend(name: str):
    return ROLLOUT_BACKENDS.register(name)


def build_rollout_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return ROLLOUT_BACKENDS.get(cfg.rollout.backend)(cfg, model)


@register_rollout_backend("native")
def native_engine(cfg: OmniConfig, model) -> RolloutEngine:
    r = cfg.rollout
    if isinstance(model, DiffusionModelBase):
        return NativeDiffusionEngine(model, r.max_num_seqs, r.max_wait_ms)
    if isinstance(model, AutoregressiveModelBase):
        return NativeTextEngine(model, r.max_num_seqs)
    raise TypeError(
        f"rollout.backend='native' has no engine for {type(model).__name__} (family {model.family!r}); "
        f"adapters derive from DiffusionModelBase or AutoregressiveModelBase"
    )


@register_rollout_backend("server")
def server_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return start_server_engine(cfg, model)
