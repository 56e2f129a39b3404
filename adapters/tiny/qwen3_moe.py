"""`tiny:qwen3_moe`: a random-weight two-layer Qwen3-MoE (hidden 32, 8 experts, top-2,
`norm_topk_prob`) with the byte-level tokenizer and ChatML template of `tiny:qwen3`. Its routers
are drawn wider than transformers' initialiser (std 0.5 instead of 0.02, seed 0) so that a token
has preferred experts, as a trained router does, instead of eight near-ties."""
from __future__ import annotations

from pathlib import Path

import torch

from adapters.tiny.qwen3 import build_byte_tokenizer
from omni_rl.models import register_tiny_model

TINY_ROUTER_STD = 0.5


@register_tiny_model("qwen3_moe")
def build_tiny_qwen3_moe(folder: Path) -> None:
    """A random-weight two-layer Qwen3-MoE (seed 0), tied embeddings, byte-level tokenizer."""
    write_tiny_qwen3_moe(folder, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)


# vLLM's CPU attention takes head_dim >= 32 (as for `tiny:qwen3_hd32`): the same MoE with two
# 32-wide heads, for rollout.backend=vllm on a CPU.
@register_tiny_model("qwen3_moe_hd32")
def build_tiny_qwen3_moe_hd32(folder: Path) -> None:
    write_tiny_qwen3_moe(folder, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def write_tiny_qwen3_moe(folder: Path, hidden_size: int, num_attention_heads: int, num_key_value_heads: int,
                         head_dim: int) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = Path(folder)
    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        head_dim=head_dim, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3MoeForCausalLM"],
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, TINY_ROUTER_STD)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
