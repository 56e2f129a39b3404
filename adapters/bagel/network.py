"""BAGEL's network in plain torch: a Qwen2.5-shaped decoder with a mixture of transformers (MoT).

Every decoder layer holds two copies of its weights: the understanding expert (`q_proj`, `k_proj`,
`v_proj`, `o_proj`, `q_norm`, `k_norm`, `mlp`, `input_layernorm`, `post_attention_layernorm`)
and the generation expert (the same names with `_moe_gen`), plus a final `norm` / `norm_moe_gen`.
Text tokens (and the image's start / end markers) take the understanding weights, image-latent
tokens the generation weights; attention is joint over both. Generation adds the DiT time
embedder, `vae2llm` / `llm2vae` (linears over 2x2 patches of 16-channel VAE latents: 64 numbers a
token) and a fixed 2-D sin-cos `latent_pos_embed`; understanding adds the `connector` MLP and
`vit_pos_embed` of the SigLIP tower (the tower itself is not built here: see adapters/bagel/checkpoint.py).

Parameter names are those of the official `ema.safetensors`
(`language_model.model.layers.{i}.self_attn.q_proj_moe_gen.weight`, `time_embedder.mlp.0.weight`,
`vae2llm.weight`, `latent_pos_embed.pos_embed`, `connector.fc1.weight`, ...).

`BagelNetwork.forward` is one packed forward of the text-to-image path: each row is
`[text (padded to L) | <vision_start> | N image tokens | <vision_end>]`. The official inference
prefills the text causally into a KV cache and then runs the image block against it with full
attention; here both run in one sequence with an explicit boolean mask that gives the same
numbers (text causal over real text tokens; the image block sees the real text and itself).
The block's tokens share one RoPE position, the row's text length, as in the official
`prepare_vae_latent`. Padded text rows attend only to themselves and are never read. sdpa,
no flash-attn.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# BAGEL's fixed geometry (every released checkpoint): FLUX's VAE has 16 channels at 8 px, and
# the network reads 2x2 latent patches, so a token covers 16 px.
LATENT_CHANNELS = 16
VAE_DOWNSAMPLE = 8
LATENT_PATCH = 2
TIME_FREQUENCIES = 256


@dataclass(frozen=True)
class LLMConfig:
    """What the network needs from the checkpoint's `llm_config.json` (a Qwen2 config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6

    @classmethod
    def from_json(cls, file: Path) -> "LLMConfig":
        raw = json.loads(Path(file).read_text())
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads") if k not in raw]
        if missing:
            raise ValueError(f"{file}: missing {missing}; expected a Qwen2 config (BAGEL's llm_config.json)")
        if raw.get("rope_scaling"):
            raise ValueError(f"{file}: rope_scaling={raw['rope_scaling']!r}; BAGEL uses plain RoPE (null)")
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**fields)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    """Qwen2's RMS norm: statistics in fp32, the weight applied in the input's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def routed(x: torch.Tensor, gen: slice, und_fn, gen_fn) -> torch.Tensor:
    """`und_fn` on the rows' understanding tokens (everything outside `gen`), `gen_fn` on the
    generation tokens (`gen`, the image block's latents), put back in sequence order."""
    und = und_fn(torch.cat([x[:, : gen.start], x[:, gen.stop :]], dim=1))
    return torch.cat([und[:, : gen.start], gen_fn(x[:, gen]), und[:, gen.start :]], dim=1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class MoTAttention(nn.Module):
    """Joint attention with per-expert q/k/v/o projections and per-head q/k RMS norms."""

    def __init__(self, c: LLMConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for suffix in ("", "_moe_gen"):
            setattr(self, f"q_proj{suffix}", nn.Linear(c.hidden_size, q, bias=True))
            setattr(self, f"k_proj{suffix}", nn.Linear(c.hidden_size, kv, bias=True))
            setattr(self, f"v_proj{suffix}", nn.Linear(c.hidden_size, kv, bias=True))
            setattr(self, f"o_proj{suffix}", nn.Linear(q, c.hidden_size, bias=False))
            setattr(self, f"q_norm{suffix}", RMSNorm(self.head_dim, c.rms_norm_eps))
            setattr(self, f"k_norm{suffix}", RMSNorm(self.head_dim, c.rms_norm_eps))

    def _qkv(self, x: torch.Tensor, suffix: str):
        b, s, _ = x.shape
        q = getattr(self, f"q_proj{suffix}")(x).view(b, s, self.heads, self.head_dim)
        k = getattr(self, f"k_proj{suffix}")(x).view(b, s, self.kv_heads, self.head_dim)
        v = getattr(self, f"v_proj{suffix}")(x).view(b, s, self.kv_heads, self.head_dim)
        q = getattr(self, f"q_norm{suffix}")(q)
        k = getattr(self, f"k_norm{suffix}")(k)
        return torch.cat([q, k, v], dim=2)

    def forward(self, x, gen: slice, cos, sin, mask):
        qkv = routed(x, gen, lambda t: self._qkv(t, ""), lambda t: self._qkv(t, "_moe_gen"))
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        cos, sin = cos[:, :, None], sin[:, :, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        out = out.transpose(1, 2).flatten(2)
        return routed(out, gen, self.o_proj, self.o_proj_moe_gen)


class MoTDecoderLayer(nn.Module):
    """One pre-norm decoder layer with both experts (FSDP shards the network layer by layer)."""

    def __init__(self, c: LLMConfig):
        super().__init__()
        self.self_attn = MoTAttention(c)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.mlp_moe_gen = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm_moe_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm_moe_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, gen: slice, cos, sin, mask):
        h = routed(x, gen, self.input_layernorm, self.input_layernorm_moe_gen)
        x = x + self.self_attn(h, gen, cos, sin, mask)
        ffn = routed(x, gen, lambda t: self.mlp(self.post_attention_layernorm(t)),
                     lambda t: self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(t)))
        return x + ffn


class Qwen2MoTModel(nn.Module):
    def __init__(self, c: LLMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(MoTDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm_moe_gen = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LanguageModel(nn.Module):
    """`language_model.*` of the checkpoint: the decoder and its (unused here) LM head."""

    def __init__(self, c: LLMConfig):
        super().__init__()
        self.model = Qwen2MoTModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)


class TimestepEmbedder(nn.Module):
    """DiT's embedder: cos/sin features of t (here sigma in [0, 1]) through a 2-layer MLP."""

    def __init__(self, hidden: int, frequencies: int = TIME_FREQUENCIES):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequencies, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.frequencies = frequencies

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        features = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(features.to(self.mlp[0].weight.dtype))


def sincos_2d(dim: int, side: int) -> torch.Tensor:
    """DiT's fixed 2-D sin-cos table [side^2, dim]: the first half encodes the row, the second
    the column (row-major positions `row * side + col`)."""

    def one_d(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    cols, rows = np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32))
    return torch.from_numpy(np.concatenate([one_d(dim // 2, rows), one_d(dim // 2, cols)], axis=1)).float()


class PositionEmbedding(nn.Module):
    """A frozen table `pos_embed` [side^2, hidden], indexed by flattened grid positions."""

    def __init__(self, side: int, hidden: int):
        super().__init__()
        self.side = side
        self.pos_embed = nn.Parameter(torch.empty(side * side, hidden), requires_grad=False)
        if not self.pos_embed.is_meta:
            with torch.no_grad():
                self.pos_embed.copy_(sincos_2d(hidden, side))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.pos_embed[ids]


class MLPConnector(nn.Module):
    """SigLIP features -> the decoder's width (understanding path; loaded, unused for text-to-image)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def block_mask(text_mask: torch.Tensor, block: int) -> torch.Tensor:
    """[B, S, S] bool (True = may attend) for rows `[text L | image block of `block` tokens]`:
    real text tokens attend causally to real text; the block attends to the real text and to
    itself; every token also to itself (padded text rows, which nothing reads)."""
    b, length = text_mask.shape
    s = length + block
    device = text_mask.device
    real = torch.cat([text_mask.bool(), torch.ones(b, block, dtype=torch.bool, device=device)], dim=1)
    idx = torch.arange(s, device=device)
    causal = idx[None, :] <= idx[:, None]
    in_block = idx >= length
    allowed = (causal | in_block[:, None]) & ~(in_block[None, :] & ~in_block[:, None])
    mask = allowed[None] & real[:, None, :]
    return mask | torch.eye(s, dtype=torch.bool, device=device)[None]


class BagelNetwork(nn.Module):
    """BAGEL's modules under the official names; `forward` is the packed text-to-image velocity."""

    def __init__(self, c: LLMConfig, max_latent_size: int, vit_hidden_size: int | None = None,
                 vit_max_patches_per_side: int = 70):
        super().__init__()
        self.config = c
        hidden = c.hidden_size
        self.language_model = LanguageModel(c)
        self.time_embedder = TimestepEmbedder(hidden)
        patch_dim = LATENT_CHANNELS * LATENT_PATCH**2
        self.vae2llm = nn.Linear(patch_dim, hidden)
        self.llm2vae = nn.Linear(hidden, patch_dim)
        self.latent_pos_embed = PositionEmbedding(max_latent_size, hidden)
        if vit_hidden_size is not None:
            self.connector = MLPConnector(vit_hidden_size, hidden)
            self.vit_pos_embed = PositionEmbedding(vit_max_patches_per_side, hidden)
        self.gradient_checkpointing = False

    @property
    def max_latent_size(self) -> int:
        return self.latent_pos_embed.side

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        c = self.config
        inv_freq = 1.0 / c.rope_theta ** (
            torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=positions.device) / c.head_dim)
        freqs = positions.float()[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, text_mask: torch.Tensor, latent_tokens: torch.Tensor,
                timesteps: torch.Tensor, grid: tuple[int, int], marker_ids: tuple[int, int]) -> torch.Tensor:
        """Velocity tokens [B, N, 64] for latent tokens [B, N, 64] (N = h * w, row-major) at
        per-row timesteps [B], conditioned on text `input_ids` [B, L] (mask [B, L], 1 = real;
        a row whose mask is all 0 is the empty context of text CFG). `marker_ids` are the ids of
        <|vision_start|> and <|vision_end|>."""
        h, w = grid
        if max(h, w) > self.max_latent_size:
            raise ValueError(
                f"a {h}x{w} token grid exceeds latent_pos_embed's {self.max_latent_size} per side "
                f"(images up to {self.max_latent_size * VAE_DOWNSAMPLE * LATENT_PATCH} px a side)"
            )
        lm = self.language_model.model
        b, length = input_ids.shape
        n = h * w
        dtype = self.vae2llm.weight.dtype
        device = latent_tokens.device
        soi, eoi = (torch.full((b, 1), i, dtype=torch.long, device=device) for i in marker_ids)
        ids = torch.cat([input_ids.to(device), soi, eoi], dim=1)
        text = lm.embed_tokens(ids)
        rows = torch.arange(h, device=device)[:, None] * self.max_latent_size + torch.arange(w, device=device)[None]
        image = (self.vae2llm(latent_tokens.to(dtype)) + self.time_embedder(timesteps.to(device))[:, None]
                 + self.latent_pos_embed(rows.reshape(-1))[None])
        x = torch.cat([text[:, :length], text[:, length : length + 1], image.to(text.dtype), text[:, length + 1 :]], dim=1)
        gen = slice(length + 1, length + 1 + n)
        text_mask = text_mask.to(device)
        text_len = text_mask.sum(dim=1, keepdim=True)
        positions = torch.cat([torch.arange(length, device=device).expand(b, -1), text_len.expand(b, n + 2)], dim=1)
        cos, sin = self.rope(positions, x.dtype)
        mask = block_mask(text_mask, n + 2)
        for layer in lm.layers:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, gen, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, gen, cos, sin, mask)
        return self.llm2vae(lm.norm_moe_gen(x[:, gen])).float()

    # --- PEFT LoRA on a plain module (the adapter's add_lora / lora_disabled use these) -------
    def add_adapter(self, config) -> None:
        from peft import inject_adapter_in_model

        inject_adapter_in_model(config, self)
        self.peft_config = {"default": config}

    def _lora_layers(self):
        from peft.tuners.tuners_utils import BaseTunerLayer

        return [m for m in self.modules() if isinstance(m, BaseTunerLayer)]

    def disable_adapters(self) -> None:
        for layer in self._lora_layers():
            layer.enable_adapters(False)

    def enable_adapters(self) -> None:
        for layer in self._lora_layers():
            layer.enable_adapters(True)

    def enable_gradient_checkpointing(self) -> None:
        self.gradient_checkpointing = True
