"""Rollout engines behind one contract (`base.RolloutEngine`), built by `rollout.backend`.

`backends.ROLLOUT_BACKENDS` holds the specs: `native` (`native.py`, `text_native.py`), `server`
(`server/`), and the GPU engines of `vllm_omni/`; `diffusion_sampling.py` is their shared
per-request maths. Importing this package imports none of its modules (names load on first use,
PEP 562), because vLLM imports `vllm_omni.vllm_worker` in workers whose environment holds little
else, and Python runs this file on the way.
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
