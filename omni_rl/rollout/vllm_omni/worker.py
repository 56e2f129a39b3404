"""The vLLM-Omni worker extension of the `vllm_omni` backend (loaded by name in its workers only).

It derives from vLLM-Omni's `CustomPipelineWorkerExtension` (which re-creates a custom pipeline)
and adds the one call `update_weights` makes through `collective_rpc`, run between two batches.
It imports vllm_omni at its top; nothing in omni_rl imports it.
"""
from __future__ import annotations

import torch
from vllm_omni.diffusion.worker.diffusion_worker import CustomPipelineWorkerExtension


class OmniRLWorkerExtension(CustomPipelineWorkerExtension):
    def omni_rl_load_tensors(self, tensors: dict[str, torch.Tensor], kind: str, version: int | None) -> int:
        """Load one bucket into the pipeline; `version` (the last bucket's) becomes the weight
        version its results record. Returns how many tensors were loaded."""
        pipeline = self.model_runner.pipeline
        loaded = pipeline.load_trainer_tensors(tensors, kind)
        if version is not None:
            pipeline.core.weight_version = version
        return loaded
