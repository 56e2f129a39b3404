"""The vLLM-Omni worker extension of the `vllm_omni` backend (loaded by name in its workers only).

vLLM-Omni mixes the class named by the engine argument `worker_extension_cls` into its diffusion
worker; with a custom pipeline that class must also re-create the pipeline, which its
`CustomPipelineWorkerExtension` does, so ours derives from it and adds the one call the engine's
`update_weights` makes through `AsyncOmni.collective_rpc`. vLLM-Omni runs such calls between
two scheduled batches, never during a forward.

This module imports vllm_omni at its top: nothing in omni_rl imports it (the engine names it).
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
