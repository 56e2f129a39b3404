"""Rollout engines behind one contract (`base.RolloutEngine`), built by `rollout.backend`.

`backends.ROLLOUT_BACKENDS` holds their specs (builder, options, capabilities): `native` (in-process; request-level batching
for diffusion in `native.py`, batched decoding for text in `text_native.py`) and `server` (the
native engine in a process and Python of its own, over loopback HTTP: `server/`), and the GPU
engines `vllm_omni` (diffusion) and `vllm` (text) of `vllm_omni/`, whose vllm imports wait until
one is built. The per-request diffusion maths they share is `diffusion_sampling.py`. The Ray rollout
engine that shards requests over workers lives with the workers (`omni_rl.workers.ray_rollout`).
"""
from omni_rl.rollout.base import RolloutEngine, RolloutEngineError
from omni_rl.rollout.native import NativeDiffusionEngine
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult

__all__ = ["DiffusionRequest", "DiffusionResult", "NativeDiffusionEngine", "RolloutEngine", "RolloutEngineError"]
