"""Qwen3-MoE causal language models (`Qwen3MoeForCausalLM`): the text adapter, plus its routers.

Everything but the routing is `adapters.qwen3.CausalLMAdapter` (transformers' loading, the chat
template, LoRA on the attention projections). `router_modules` names each sparse layer's router
(`mlp.gate`, a `Qwen3MoeTopKRouter`), so the rollout records routed experts and the trainer
replays them (`algo.family_options.routing_replay`, `omni_rl.models.moe_routing`). Layers that
transformers builds dense (`mlp_only_layers`, `decoder_sparse_step`) have no router and no routes.
Its tiny model is `adapters/tiny/qwen3_moe.py`, its planner view `adapters/plan/qwen3_moe.py`.
"""
from __future__ import annotations

import torch

from adapters.qwen3 import CausalLMAdapter
from omni_rl.models import register_adapter


@register_adapter("Qwen3MoeForCausalLM")
class Qwen3MoeAdapter(CausalLMAdapter):
    def router_modules(self) -> list[torch.nn.Module]:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        return [layer.mlp.gate for layer in self.checkpointed_layers() if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)]
