"""Rollout engines behind one contract (`base.RolloutEngine`), built by `rollout.backend`.

`backends.ROLLOUT_BACKENDS` holds their specs (builder, options, capabilities): `native` (in-process; request-level batching
for diffusion in `native.py`, batched decoding for text in `text_native.py`) and `server` (the
native engine in a process and Python of its own, over loopback HTTP: `server/`), and the GPU
engines `vllm_omni` (diffusion) and `vllm` (text) of `vllm_omni/`, whose vllm imports wait until
one is built. The per-request diffusion maths they share is `diffusion_sampling.py`. The Ray rollout
engine that shards requests over workers lives with the workers (`omni_rl.workers.ray_rollout`).

Importing this package imports none of its modules: the names below load on first use (PEP 562).
vLLM imports `vllm_omni.vllm_worker` by name in its workers, in an environment that may hold
vLLM and little else (no hydra, no diffusers), and Python runs this file on the way there.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "RolloutEngine": "omni_rl.rollout.base",
    "RolloutEngineError": "omni_rl.rollout.base",
    "NativeDiffusionEngine": "omni_rl.rollout.native",
    "DiffusionRequest": "omni_rl.rollout.types",
    "DiffusionResult": "omni_rl.rollout.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
