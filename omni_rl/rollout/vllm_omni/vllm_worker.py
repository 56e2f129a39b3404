"""The vLLM worker extension of the `vllm` text backend (loaded by name in vLLM's workers only).

Imports torch and safetensors only. `omni_rl_load_weights` receives a full-weight update through
`LLM.collective_rpc` one safetensors bucket at a time and at the last one reloads in place
(`model_runner.reload_weights`), then re-ties a tied `lm_head`. LoRA updates are `LoRARequest`s.
"""
from __future__ import annotations

import torch
from safetensors.torch import load as load_safetensors


def retie_lm_head(model: torch.nn.Module) -> bool:
    """Point a tied `lm_head` at the input embedding's weights again and rerun its post-load
    processing (a CPU backend's packed copy of them). Returns whether the model ties them."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    # vLLM's causal LMs keep the embedding at `model.embed_tokens`; some have the accessor.
    inner = getattr(model, "model", None)
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(inner, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embedding is None:
        return False
    if head.weight is not embedding.weight:
        head.weight = embedding.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


class OmniRLVllmWorkerExtension:
    def omni_rl_load_weights(self, blob: bytes, last: bool) -> int:
        """Take one bucket (safetensors bytes); at the `last` one, load every bucket taken since
        the previous load into the model. Returns how many tensors were loaded (0 until the last)."""
        pending = self.__dict__.setdefault("_omni_rl_pending", [])
        pending.append(blob)
        if not last:
            return 0
        self._omni_rl_pending = []
        tensors: dict[str, torch.Tensor] = {}
        for part in pending:
            tensors.update(load_safetensors(part))
        model = self.model_runner.get_model()
        device = next(model.parameters()).device
        self.model_runner.reload_weights(weights_iterator=[(name, t.to(device)) for name, t in tensors.items()],
                                         is_checkpoint_format=True)
        retie_lm_head(model)
        return len(tensors)
