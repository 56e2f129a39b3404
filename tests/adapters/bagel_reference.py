"""A plain loop over BAGEL's published sampling, for the BAGEL adapters' tests (BAGEL has no
diffusers pipeline to compare with), written on its own.

It follows the official inferencer's structure: a context prefilled piece by piece into a KV
cache, each piece at its own RoPE positions attending to the cache and to itself (an editing
request's source image first, as `<|vision_start|> VAE latents <|vision_end|>` at t = 0 on the
generation expert and then `<|vision_start|> SigLIP tokens <|vision_end|>` on the understanding
expert, one position each; then the prompt, causally, a position a token); then each step the
image block `<|vision_start|> latents <|vision_end|>` at the next position, attending to the
cache and itself. Text CFG's context is the empty one (text-to-image) or the source image alone
(editing), image CFG's the prompt alone; the official combination `u + g (c - u)`, then
`ui + g_img (v - ui)`, the "global" renorm by |c| / |v|, and `x <- x - v (t_i - t_i+1)`.

It has its own attention, norms, RoPE, routing (both experts on every token, picked by a mask),
time embedding, patching and connector maths, and its own SigLIP: transformers'
`SiglipVisionModel` as published (the convolution patch embedding, its own position ids; the
checkpoint's linear weight folded back into the convolution) fed by torchvision's transforms, as
the official `vit_transform` is. Only the weights and the VAE are the model's.
"""
import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from safetensors import safe_open

from adapters.bagel.adapter import BOS, EOS, IMAGE_END, IMAGE_START
from adapters.bagel.checkpoint import read_network
from adapters.bagel.network import BagelNetwork

EMPTY = (None, 0)  # a context: (KV cache, one (k, v) a layer, or None; the next RoPE position)


def _rms(x, weight, eps=1e-6):
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, pos, theta, dim):
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    f = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _layers(net, x, gen, pos, past, causal):
    """The decoder over tokens x [S, D] (gen: [S] bool, True = generation expert), with the cached
    keys / values `past` (one (k, v) a layer, or None) in front; returns (hidden, new cache)."""
    c = net.config
    heads, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    g = gen[:, None]

    def pick(und, gen_):
        return torch.where(g, gen_, und)

    cache = []
    for i, layer in enumerate(net.language_model.model.layers):
        a = layer.self_attn
        h = pick(_rms(x, layer.input_layernorm.weight), _rms(x, layer.input_layernorm_moe_gen.weight))
        q = pick(a.q_proj(h), a.q_proj_moe_gen(h)).view(-1, heads, d)
        k = pick(a.k_proj(h), a.k_proj_moe_gen(h)).view(-1, kv, d)
        v = pick(a.v_proj(h), a.v_proj_moe_gen(h)).view(-1, kv, d)
        q = torch.where(gen[:, None, None], _rms(q, a.q_norm_moe_gen.weight), _rms(q, a.q_norm.weight))
        k = torch.where(gen[:, None, None], _rms(k, a.k_norm_moe_gen.weight), _rms(k, a.k_norm.weight))
        q, k = _rope(q, pos, c.rope_theta, d), _rope(k, pos, c.rope_theta, d)
        if past is not None:
            k, v = torch.cat([past[i][0], k]), torch.cat([past[i][1], v])
        cache.append((k, v))
        kk, vv = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(d)
        if causal:  # the cached tokens all come before the new ones
            keep = torch.ones(q.shape[0], kk.shape[0], dtype=torch.bool).tril(kk.shape[0] - q.shape[0])
            scores = scores.masked_fill(~keep, float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(-1, heads * d)
        x = x + pick(a.o_proj(att), a.o_proj_moe_gen(att))
        h = pick(_rms(x, layer.post_attention_layernorm.weight), _rms(x, layer.post_attention_layernorm_moe_gen.weight))

        def ffn(m, t):
            return m.down_proj(F.silu(m.gate_proj(t)) * m.up_proj(t))

        x = x + pick(ffn(layer.mlp, h), ffn(layer.mlp_moe_gen, h))
    return x, cache


def _time_embedding(net, t):
    half = 128
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = torch.as_tensor(t, dtype=torch.float32) * freqs
    mlp = net.time_embedder.mlp
    return mlp[2](F.silu(mlp[0](torch.cat([torch.cos(args), torch.sin(args)]))))


def _latent_embedding(net, tokens, t, grid):
    h, w = grid
    side = int(round(net.latent_pos_embed.pos_embed.shape[0] ** 0.5))
    ids = torch.tensor([r * side + c for r in range(h) for c in range(w)])
    return net.vae2llm(tokens) + _time_embedding(net, t) + net.latent_pos_embed.pos_embed[ids]


def _block(net, inner, markers):
    embed = net.language_model.model.embed_tokens
    return torch.cat([embed(torch.tensor([markers[0]])), inner, embed(torch.tensor([markers[1]]))])


def _prefill_text(net, ids, context):
    cache, start = context
    x = net.language_model.model.embed_tokens(torch.tensor(ids))
    _, cache = _layers(net, x, torch.zeros(len(ids), dtype=torch.bool), start + torch.arange(len(ids)), cache, causal=True)
    return cache, start + len(ids)


def _prefill_block(net, inner, markers, generation, context):
    """An image block of the context: full attention, one position, then the next."""
    cache, start = context
    x = _block(net, inner, markers)
    gen = torch.zeros(x.shape[0], dtype=torch.bool)
    gen[1:-1] = generation
    _, cache = _layers(net, x, gen, torch.full((x.shape[0],), start), cache, causal=False)
    return cache, start + 1


def _velocity(net, tokens, t, grid, context, markers):
    """One image-block forward against a prefilled context."""
    cache, start = context
    x = _block(net, _latent_embedding(net, tokens, t, grid), markers)
    gen = torch.zeros(x.shape[0], dtype=torch.bool)
    gen[1:-1] = True
    out, _ = _layers(net, x, gen, torch.full((x.shape[0],), start), cache, causal=False)
    return net.llm2vae(_rms(out[1:-1], net.language_model.model.norm_moe_gen.weight))


def _patches(latent, p=2):
    c, hh, ww = latent.shape
    return torch.einsum("chpwq->hwpqc", latent.reshape(c, hh // p, p, ww // p, p)).reshape(-1, p * p * c)


# --- the source image --------------------------------------------------------------------------
def siglip(folder: Path):
    """transformers' SiglipVisionModel as published (a conv patch embedding), with the official
    one-layer-short depth and no head, holding the checkpoint's `vit_model.*` weights."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    raw = json.loads((folder / "vit_config.json").read_text())
    config = SiglipVisionConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    config.num_hidden_layers -= 1
    config.vision_use_head = False
    model = SiglipVisionModel(config)
    prefix = "vit_model.vision_model."
    state = {}
    with safe_open(str(folder / "ema.safetensors"), framework="pt") as f:
        for key in f.keys():
            if key.startswith(prefix):
                state[key[len(prefix):]] = f.get_tensor(key).float()
    weight = state["embeddings.patch_embedding.weight"]  # the official linear: [D, p * p * c] in (p, q, c) order
    p, c = config.patch_size, config.num_channels
    state["embeddings.patch_embedding.weight"] = weight.reshape(-1, p, p, c).permute(0, 3, 1, 2)
    if hasattr(model, "vision_model"):
        state = {f"vision_model.{k}": v for k, v in state.items()}
    model.load_state_dict(state, strict=False)  # the position ids are a buffer, not in the file
    return model.eval()


def _source_blocks(pipe, image, size, context):
    """The context after the source image's VAE block and ViT block (module docstring)."""
    from torchvision import transforms as T

    net, vae = pipe.network, pipe.vae
    image = T.Resize(size, T.InterpolationMode.BICUBIC)(image)  # the condition image
    normalise = T.Compose([T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    z = vae.encode(normalise(image)[None]).latent_dist.mean[0]
    latent = vae.config.scaling_factor * (z - vae.config.shift_factor)
    grid = (latent.shape[1] // 2, latent.shape[2] // 2)
    context = _prefill_block(net, _latent_embedding(net, _patches(latent), 0.0, grid), pipe.markers, True, context)
    # A square source fills the tiny tower's whole position grid: its own position ids (0..K-1)
    # are BAGEL's row * side + col there.
    config = pipe.vit.config
    vit_side = T.Resize((config.image_size, config.image_size), T.InterpolationMode.BICUBIC)
    features = pipe.vit(pixel_values=normalise(vit_side(image))[None]).last_hidden_state[0]
    fc1, fc2 = net.connector.fc1, net.connector.fc2
    tokens = fc2(F.gelu(fc1(features), approximate="tanh")) + net.vit_pos_embed.pos_embed[: features.shape[0]]
    return _prefill_block(net, tokens, pipe.markers, False, context)


@torch.no_grad()
def reference_latents(pipe, prompt, latents, steps, guidance, case):
    """The suite's `pipeline_latents`: clean latents [1, 16, h, w] from initial ones (module docstring)."""
    net, tok = pipe.network, pipe.tokenizer
    ids = [tok.convert_tokens_to_ids(BOS), *tok(prompt, add_special_tokens=False)["input_ids"][: pipe.max_len],
           tok.convert_tokens_to_ids(EOS)]
    if case.source_image is None:
        text_uncond, image_uncond = EMPTY, None
    else:
        text_uncond = _source_blocks(pipe, case.source_image(prompt).convert("RGB"), (case.height, case.width), EMPTY)
        image_uncond = _prefill_text(net, ids, EMPTY) if pipe.image_scale > 1 else None
    cond = _prefill_text(net, ids, text_uncond)
    c, hh, ww = latents.shape[1:]
    h, w = hh // 2, ww // 2
    x = _patches(latents[0].float())
    t = torch.linspace(1, 0, steps + 1)
    t = pipe.shift * t / (1 + (pipe.shift - 1) * t)
    lo, hi = pipe.interval
    for i in range(steps):
        v = _velocity(net, x, t[i], (h, w), cond, pipe.markers)
        if guidance > 1 and lo < t[i] <= hi:
            u = _velocity(net, x, t[i], (h, w), text_uncond, pipe.markers)
            guided = u + guidance * (v - u)
            if image_uncond is not None:
                ui = _velocity(net, x, t[i], (h, w), image_uncond, pipe.markers)
                guided = ui + pipe.image_scale * (guided - ui)
            v = guided * (v.norm() / (guided.norm() + 1e-8)).clamp(min=pipe.renorm_min, max=1.0)
        x = x - v * (t[i] - t[i + 1])
    out = torch.einsum("hwpqc->chpwq", x.reshape(h, w, 2, 2, c)).reshape(c, hh, ww)
    return out[None]


def pipeline(model, fresh: bool):
    """The suite's `pipeline`: the reference's inputs (with `fresh`, a network read anew from the
    model's folder)."""
    net = model.network
    if fresh:
        with torch.device("meta"):
            net = BagelNetwork(model.llm_config, net.max_latent_size, net.connector.fc1.in_features, net.vit_pos_embed.side)
        read_network(net, Path(model.path), torch.float32)
    cfg, options, tok = model.cfg, model.options, model.tokenizer
    return SimpleNamespace(network=net, tokenizer=tok, shift=options.timestep_shift, max_len=options.max_sequence_length,
                           interval=options.cfg_interval or (0.0, 1.0), renorm_min=options.cfg_renorm_min,
                           image_scale=options.image_guidance_scale, vae=model.vae, vit=siglip(Path(model.path)),
                           markers=(tok.convert_tokens_to_ids(IMAGE_START), tok.convert_tokens_to_ids(IMAGE_END)))


def load_lora(pipe, folder):
    from peft import PeftModel

    pipe.network = PeftModel.from_pretrained(pipe.network, folder).base_model.model
