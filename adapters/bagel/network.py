"""BAGEL's network in plain torch: a Qwen2.5-shaped decoder with a mixture of transformers (MoT).

Every decoder layer holds two copies of its weights: the understanding expert (`q_proj`, `k_proj`,
`v_proj`, `o_proj`, `q_norm`, `k_norm`, `mlp`, `input_layernorm`, `post_attention_layernorm`)
and the generation expert (the same names with `_moe_gen`), plus a final `norm` / `norm_moe_gen`.
Text tokens (and the image's start / end markers) take the understanding weights, image-latent
tokens the generation weights; attention is joint over both. Generation adds the DiT time
embedder, `vae2llm` / `llm2vae` (linears over 2x2 patches of 16-channel VAE latents: 64 numbers a
token) and a fixed 2-D sin-cos `latent_pos_embed`; understanding adds the `connector` MLP and
`vit_pos_embed` of the SigLIP tower.

Parameter names are those of the official `ema.safetensors`
(`language_model.model.layers.{i}.self_attn.q_proj_moe_gen.weight`, `time_embedder.mlp.0.weight`,
`vae2llm.weight`, `latent_pos_embed.pos_embed`, `connector.fc1.weight`, ...).

`BagelNetwork.forward` is one packed forward: each row is the official context in order, the
source image's blocks for editing (`SourceImage`: its clean VAE latents at timestep 0 through
the generation expert, then its SigLIP tokens through `connector` + `vit_pos_embed`), the text
(padded to L), then `<vision_start> N image tokens <vision_end>`. The official inference
prefills the context piece by piece into a KV cache and then runs the image block against it
with full attention; here all of it runs in one sequence with an explicit boolean mask and
per-row RoPE positions that give the same numbers (adapters/bagel/layout.py). The block's
tokens share one RoPE position, as in the official `prepare_vae_latent`. Padded tokens attend
only to themselves and are never read. sdpa, no flash-attn.

The SigLIP tower itself is not a module of the network (adapters/bagel/vision.py): it is frozen
and runs once per source image when the request is admitted, so `forward` takes its output.
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

from adapters.bagel.layout import Routing, Segment, image_block, pack

# BAGEL's fixed geometry (every released checkpoint): FLUX's VAE has 16 channels at 8 px, and
# the network reads 2x2 latent patches, so a token covers 16 px.
LATENT_CHANNELS = 16
VAE_DOWNSAMPLE = 8
LATENT_PATCH = 2
TIME_FREQUENCIES = 256


def plain_rope(scaling) -> bool:
    """Whether a Qwen2 config's `rope_scaling` leaves RoPE plain: absent, null, empty, or
    transformers' "default" type (`rope_type`, or the older `type`) without a factor other
    than 1, as newer transformers releases write the field for an unscaled model. The official
    code would apply any other type (its `ROPE_INIT_FUNCTIONS`); this network does not."""
    if not scaling:
        return True
    if not isinstance(scaling, dict):
        return False
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return kind == "default" and float(scaling.get("factor", 1.0)) == 1.0


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
        if not plain_rope(raw.get("rope_scaling")):
            raise ValueError(f"{file}: rope_scaling={raw['rope_scaling']!r}; this network implements plain RoPE only "
                             f"(null, or rope_type 'default' with factor 1), as BAGEL-7B-MoT's decoder runs it")
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**fields)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class SourceImage:
    """An editing request's source image, both encodings, one row each (padded rows allowed).

    latents [B, M, 64]: its clean VAE latent patches in BAGEL's space, on the token grid `grid`
    (h, w), M = h w; vit [B, K, D_vit]: the SigLIP tower's output for its patches, at flattened
    positions vit_positions [B, K] (row * vit_max_num_patch_per_side + col); present [B] bool:
    False for a row that must not see it (image CFG's image-unconditional branch)."""

    latents: torch.Tensor
    grid: tuple[int, int]
    vit: torch.Tensor
    vit_positions: torch.Tensor
    present: torch.Tensor


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

    def forward(self, x, routing: Routing, cos, sin, mask):
        qkv = routing(x, lambda t: self._qkv(t, ""), lambda t: self._qkv(t, "_moe_gen"))
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        cos, sin = cos[:, :, None], sin[:, :, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        out = out.transpose(1, 2).flatten(2)
        return routing(out, self.o_proj, self.o_proj_moe_gen)


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

    def forward(self, x, routing: Routing, cos, sin, mask):
        h = routing(x, self.input_layernorm, self.input_layernorm_moe_gen)
        x = x + self.self_attn(h, routing, cos, sin, mask)
        ffn = routing(x, lambda t: self.mlp(self.post_attention_layernorm(t)),
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
    """`language_model.*` of the checkpoint: the decoder and its LM head (read by the think stage only)."""

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
    """SigLIP features -> the decoder's width (understanding path: editing's source image)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class BagelNetwork(nn.Module):
    """BAGEL's modules under the official names (the SigLIP tower aside); `forward` is the packed velocity."""

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

    def embed_latents(self, tokens: torch.Tensor, timesteps: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """VAE latent patches [B, n, 64] of an h x w token grid at per-row timesteps [B] ->
        `vae2llm(x) + time_embedder(t) + latent_pos_embed(row * max_latent_size + col)`."""
        h, w = grid
        if max(h, w) > self.max_latent_size:
            raise ValueError(
                f"a {h}x{w} token grid exceeds latent_pos_embed's {self.max_latent_size} per side "
                f"(images up to {self.max_latent_size * VAE_DOWNSAMPLE * LATENT_PATCH} px a side)"
            )
        device = tokens.device
        ids = torch.arange(h, device=device)[:, None] * self.max_latent_size + torch.arange(w, device=device)[None]
        return (self.vae2llm(tokens.to(self.vae2llm.weight.dtype)) + self.time_embedder(timesteps.to(device))[:, None]
                + self.latent_pos_embed(ids.reshape(-1))[None])

    def embed_vit(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """SigLIP features [B, K, D_vit] at flattened patch positions [B, K] -> `connector(f) +
        vit_pos_embed(position)` (the official `forward_cache_update_vit`)."""
        if not hasattr(self, "connector"):
            raise ValueError("this checkpoint has no vit_config.json: it holds no connector for SigLIP tokens")
        return self.connector(features.to(self.connector.fc1.weight.dtype)) + self.vit_pos_embed(positions)

    def forward(self, input_ids: torch.Tensor, text_mask: torch.Tensor, latent_tokens: torch.Tensor,
                timesteps: torch.Tensor, grid: tuple[int, int], marker_ids: tuple[int, int],
                source: SourceImage | None = None) -> torch.Tensor:
        """Velocity tokens [B, N, 64] for latent tokens [B, N, 64] (N = h * w, row-major) at
        per-row timesteps [B], conditioned on text `input_ids` [B, L] (mask [B, L], 1 = real;
        a row whose mask is all 0 has no text) and, for editing, on `source` (a row whose
        `source.present` is False has no source image). `marker_ids` are the ids of
        <|vision_start|> and <|vision_end|>. Each row is the official context in order: the
        source's VAE block, its ViT block, the text, then the image being generated
        (adapters/bagel/layout.py)."""
        lm = self.language_model.model
        b, n = latent_tokens.shape[0], grid[0] * grid[1]
        device = latent_tokens.device
        text = lm.embed_tokens(input_ids.to(device))
        markers = lm.embed_tokens(torch.tensor(marker_ids, device=device))[None].expand(b, -1, -1)
        segments = [] if source is None else self.source_segments(source, markers)
        text_mask = text_mask.to(device).bool()
        length = text.shape[1]
        segments.append(Segment(text, text_mask, True, torch.arange(length, device=device), text_mask.sum(1), (0, 0)))
        image = self.embed_latents(latent_tokens, timesteps, grid)
        segments.append(image_block(image.to(text.dtype), markers, torch.ones(b, dtype=torch.bool, device=device)))
        x = self.decode_packed(pack(segments))
        # The generated image's tokens: the last segment less its end marker.
        return self.llm2vae(lm.norm_moe_gen(x[:, -1 - n : -1])).float()

    def decode_packed(self, packed) -> torch.Tensor:
        """The decoder layers over a packed sequence (adapters/bagel/layout.py): hidden states [B, S, D]."""
        x = packed.x
        cos, sin = self.rope(packed.positions, x.dtype)
        for layer in self.language_model.model.layers:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, packed.routing, cos, sin, packed.mask, use_reentrant=False)
            else:
                x = layer(x, packed.routing, cos, sin, packed.mask)
        return x

    def text_logits(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Logits [B, L_1 + ... + L_k, V] (fp32) of text alone through the understanding expert,
        its final `norm` and `lm_head` (the official `generate_text` path): `parts` are (ids
        [B, L_i], mask [B, L_i]) pieces in context order, each right-padded, each a causal
        segment that sees every real token of the earlier ones; a piece's padding moves no
        position, so each row's real tokens sit where one unpadded sequence puts them."""
        lm = self.language_model.model
        device = lm.embed_tokens.weight.device
        segments = []
        for ids, mask in parts:
            mask = mask.to(device).bool()
            length = ids.shape[1]
            segments.append(Segment(lm.embed_tokens(ids.to(device)), mask, True, torch.arange(length, device=device),
                                    mask.sum(1), (0, 0)))
        x = self.decode_packed(pack(segments))
        return self.language_model.lm_head(lm.norm(x)).float()

    def source_segments(self, source: SourceImage, markers: torch.Tensor) -> list[Segment]:
        """The source image's two blocks: its clean VAE latents at timestep 0 (generation
        expert, the official `forward_cache_update_vae`), then its SigLIP tokens (understanding)."""
        b = source.latents.shape[0]
        present = source.present.to(markers.device).bool()
        zero = torch.zeros(b, device=markers.device)
        vae = self.embed_latents(source.latents.to(markers.device), zero, source.grid)
        vit = self.embed_vit(source.vit.to(markers.device), source.vit_positions.to(markers.device))
        return [image_block(vae.to(markers.dtype), markers, present),
                image_block(vit.to(markers.dtype), markers, present, generation=False)]

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
