"""`tiny:qwen3_omni_talker`: `tiny:qwen3_omni`'s thinker with a 1-layer talker (hidden 16), a
1-layer
code predictor, K = 4 codebooks of 56 codes, and a code2wav (8 samples a frame) whose weights are
redrawn with a variance-preserving scale (std 1 / sqrt(fan-in); transformers' std 0.02 leaves its
output at ~1e-6, silence). Each code's embedding then points the decoder a different way, so
the waveform's loudness follows the codes: a clip of one repeated code has RMS from 0.08 to 0.69
by code, 12 frames of random codes 0.48 +- 0.04 (tests/adapters/test_qwen3_omni_talker.py checks
the spread). The
talker's and the code predictor's output heads are drawn wider (std 0.5) so the random policy
has preferences to shift, as the thinker's lm_head is.
The builder of the adapter in `adapters/qwen3_omni_talker.py`."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from omni_rl.models import register_tiny_model

from adapters.tiny.qwen3_omni import build_tiny_omni


TINY_CODES = 56  # codebook size; the talker's ids 56..63 are its special tokens (57..62 in use)
TINY_GROUPS = 4  # K: the first codebook and 3 residual ones


def _tiny_voice(model) -> None:
    """Make the tiny talker's numbers meaningful (see the module docstring)."""
    g = torch.Generator().manual_seed(28)
    with torch.no_grad():
        # transformers 5.24 leaves the talker's MoE experts and router uninitialised (torch.empty:
        # whatever the memory held, NaN included): draw them as it draws linears.
        for name, p in model.talker.model.named_parameters():
            if ".mlp.experts." in name or ".mlp.gate." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        model.talker.codec_head.weight.copy_(torch.randn(model.talker.codec_head.weight.shape, generator=g) * 0.5)
        for head in model.talker.code_predictor.lm_head:
            head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.5)
        decoder = model.code2wav
        last = f"decoder.{len(decoder.decoder) - 1}.conv.weight"
        for name, p in decoder.named_parameters():
            if name == "code_embedding.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("weight") and p.dim() >= 2:
                transposed = isinstance(_owner(decoder, name), torch.nn.ConvTranspose1d)
                fan_in = p.shape[0] * p.shape[2] if transposed else p[0].numel()
                # A last layer at 0.15 keeps the waveform off code2wav's clamp at +-1.
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in) * (0.15 if name == last else 1.0))


def _owner(root: torch.nn.Module, name: str) -> torch.nn.Module:
    return root.get_submodule(name.rsplit(".", 1)[0])


@register_tiny_model("qwen3_omni_talker")
def build_tiny_qwen3_omni_talker(folder: Path) -> None:
    build_tiny_omni(
        folder,
        talker_changes=dict(
            num_code_groups=TINY_GROUPS,
            code_predictor_config=dict(
                vocab_size=TINY_CODES, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, num_code_groups=TINY_GROUPS,
            ),
        ),
        code2wav_changes=dict(codebook_size=TINY_CODES, num_quantizers=TINY_GROUPS),
        tts_tokens={"tts_bos_token_id": "<|audio_start|>", "tts_eos_token_id": "<|audio_end|>"},
        finish=_tiny_voice,
    )
