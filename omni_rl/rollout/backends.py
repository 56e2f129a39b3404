"""`ROLLOUT_BACKENDS`: `rollout.backend` names the factory that builds a rollout engine.

One signature: `factory(cfg: OmniConfig, model) -> RolloutEngine`, called wherever a model that
samples lives (this process, or each Ray worker's rollout copy). `native` is the in-process
engine of the model's kind: request-level batching for diffusion, batched decoding for text;
`server` runs that engine in a process (and Python, `rollout.python`) of its own, over HTTP.
`vllm_omni` (diffusion) and `vllm` (text) are the GPU engines of `rollout/vllm_omni/`: with
`rollout.python` null they run in this process (which then needs vllm / vllm-omni); with
`rollout.python` set (the CUDA image: /opt/vllm-omni/bin/python) the trainer talks to them
through the rollout server started in that Python (`--backend vllm_omni`; inside the server,
`rollout.python` reads null, so the same factory builds the engine there). vllm / vllm-omni are
imported inside the factories only, so the registry works without them. A factory whose engine
loads the checkpoint itself carries `loads_own_weights = True`: the server then builds the
model weightless (configs, tokenizers, shapes), not a second copy of the weights.
Register another with `@register_rollout_backend("name")` in a plugin module.

Pipelined training (`trainer.pipeline` one_step_off / async) samples while the trainer updates.
A factory says whether its engine can with `beside_trainer(cfg) -> None | reason` (no attribute:
it cannot); one that samples with the model it is given marks `shares_model = True`, and the
trainer then gives it a copy of its own (`LocalActorGroup`).
"""
from __future__ import annotations

from typing import Optional

from omni_rl.config.schema import OmniConfig
from omni_rl.models.loading import resolve_model_path
from omni_rl.models.autoregressive import AutoregressiveModelBase
from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.registry import Registry
from omni_rl.rollout.base import RolloutEngine, weight_kind
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.server.client import start_server_engine
from omni_rl.rollout.text_native import NativeTextEngine

ROLLOUT_BACKENDS: Registry = Registry("rollout backend")


def register_rollout_backend(name: str):
    return ROLLOUT_BACKENDS.register(name)


def build_rollout_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return ROLLOUT_BACKENDS.get(cfg.rollout.backend)(cfg, model)


def beside_trainer_problem(cfg: OmniConfig) -> Optional[str]:
    """Why `rollout.backend`'s engine cannot sample while the trainer updates; None if it can."""
    check = getattr(ROLLOUT_BACKENDS.get(cfg.rollout.backend), "beside_trainer", None)
    if check is None:
        return "its factory does not declare that it can sample while the trainer updates (beside_trainer)"
    return check(cfg)


def shares_model(cfg: OmniConfig) -> bool:
    """Whether `rollout.backend`'s engine samples with the very model object it is built on."""
    return getattr(ROLLOUT_BACKENDS.get(cfg.rollout.backend), "shares_model", False)


@register_rollout_backend("native")
def native_engine(cfg: OmniConfig, model) -> RolloutEngine:
    r = cfg.rollout
    if isinstance(model, DiffusionModelBase):
        return NativeDiffusionEngine(model, r.max_num_seqs, r.max_wait_ms, r.trajectory_device)
    if isinstance(model, AutoregressiveModelBase):
        return NativeTextEngine(model, r.max_num_seqs)
    raise TypeError(
        f"rollout.backend='native' has no engine for {type(model).__name__} (family {model.family!r}); "
        f"adapters derive from DiffusionModelBase or AutoregressiveModelBase"
    )


@register_rollout_backend("server")
def server_engine(cfg: OmniConfig, model) -> RolloutEngine:
    return start_server_engine(cfg, model)


def _start_from_trainer(engine: RolloutEngine, model) -> RolloutEngine:
    """Version 0 is the model's own trainable tensors (as the server client sends them), unless
    the model is a weightless view (inside the rollout server, whose client sends them)."""
    if not model.weightless:
        try:
            engine.update_weights(model.named_trainable_tensors(), 0, weight_kind(model))
        except BaseException:
            engine.close()
            raise
    return engine


def _check_family(backend: str, model, family: type, hint: str) -> None:
    if not isinstance(model, family):
        raise TypeError(
            f"rollout.backend={backend!r} has no engine for {type(model).__name__} (family {model.family!r}); {hint}"
        )


@register_rollout_backend("vllm_omni")
def vllm_omni_engine(cfg: OmniConfig, model) -> RolloutEngine:
    _check_family("vllm_omni", model, DiffusionModelBase, "it samples diffusion models: use rollout.backend=vllm for text")
    if cfg.rollout.python is not None:
        return start_server_engine(cfg, model, backend="vllm_omni")
    from omni_rl.rollout.vllm_omni.availability import require
    from omni_rl.rollout.vllm_omni.engine import VllmOmniDiffusionEngine

    require("vllm_omni")
    return _start_from_trainer(VllmOmniDiffusionEngine(cfg, model, resolve_model_path(cfg.model.path, cfg.model.revision)), model)


@register_rollout_backend("vllm")
def vllm_engine(cfg: OmniConfig, model) -> RolloutEngine:
    _check_family("vllm", model, AutoregressiveModelBase, "it samples text models: use rollout.backend=vllm_omni for diffusion")
    if cfg.rollout.python is not None:
        return start_server_engine(cfg, model, backend="vllm")
    from omni_rl.rollout.vllm_omni.availability import require
    from omni_rl.rollout.vllm_omni.text_engine import VllmTextEngine

    require("vllm")
    return _start_from_trainer(VllmTextEngine(cfg, model, resolve_model_path(cfg.model.path, cfg.model.revision)), model)


def _own_process_only(cfg: OmniConfig) -> Optional[str]:
    if cfg.rollout.python is not None:
        return None  # the engine runs behind the rollout server, in a process of its own
    return (f"in this process (rollout.python=null) the {cfg.rollout.backend} engine shares the trainer's "
            f"accelerator and has not been run beside an update; set rollout.python (e.g. "
            f"/opt/vllm-omni/bin/python) to run it in a process of its own")


vllm_omni_engine.loads_own_weights = True
vllm_engine.loads_own_weights = True
# The native engine samples with the model it is given; beside the trainer that is a copy.
native_engine.shares_model = True
native_engine.beside_trainer = lambda cfg: None
server_engine.beside_trainer = lambda cfg: None  # its own process and copy, synced by update_weights
vllm_omni_engine.beside_trainer = _own_process_only
vllm_engine.beside_trainer = _own_process_only
