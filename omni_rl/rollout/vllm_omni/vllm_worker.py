"""The vLLM worker extension of the `vllm` text backend (loaded by name in vLLM's workers only).

vLLM mixes the class named by `LLM(worker_extension_cls=...)` into its GPU worker; the text
engine's full-weight update calls `omni_rl_load_weights` through `LLM.collective_rpc`, which hands
the named tensors to the model's own `load_weights` (checkpoint names, as the adapter's
`checkpoint_prefix` spells them). LoRA updates do not come here: they are `LoRARequest`s.
"""
from __future__ import annotations

import torch


class OmniRLVllmWorkerExtension:
    def omni_rl_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        device = next(self.model_runner.model.parameters()).device
        self.model_runner.model.load_weights(weights=[(name, t.to(device)) for name, t in named])
        return len(named)
