"""Rollout engines behind one contract (`base.RolloutEngine`), built by `rollout.backend`.

`backends.ROLLOUT_BACKENDS` holds the specs. Importing this package imports none of its modules
(PEP 562 lazy names): vLLM workers import `vllm_omni.vllm_worker` through it with little else installed.
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
