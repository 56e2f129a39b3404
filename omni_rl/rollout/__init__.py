"""Rollout engines: `native` (in-process, request-level batching); `vllm_omni` on GPUs later."""
from omni_rl.rollout.native import NativeDiffusionEngine, RolloutEngineError
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult

__all__ = ["DiffusionRequest", "DiffusionResult", "NativeDiffusionEngine", "RolloutEngineError"]
