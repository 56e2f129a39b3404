"""The packed sequence of one BAGEL forward: its segments in context order, and what the decoder
reads from them (the attention mask, the RoPE positions, which tokens each expert takes).

The official inference builds a sample's context one piece at a time into a KV cache, each piece
attending to the cache and to itself (`forward_cache_update_vae` / `_vit` / `_text`), and then
runs the image being generated against the whole cache. Here every piece is a `Segment` of one
sequence and one boolean mask gives each token exactly what the cache gave it:

- a token sees every real token of the earlier segments, and in its own segment every real
  token (an image block: full attention) or the real tokens up to itself (text: causal);
- every token also sees itself, so a padded token (text padding, or the source-image blocks of a
  row without a source image) has a defined output, which nothing reads;
- RoPE positions run on per row: a text segment takes one position a real token, an image block
  (its start / end markers and all its tokens) a single position, as the official `prepare_*`
  functions count them. A segment that is absent from a row (all padding) moves nothing, so a
  row's real tokens sit where they would sit in that row's own cache.

`Routing` sends the generation tokens (VAE latents: noisy or the source image's clean ones) through
the generation expert and the rest (text, markers, ViT tokens) through the understanding expert,
by index, as the official MoT layers split `packed_vae_token_indexes` from `packed_text_indexes`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Segment:
    """One piece of context, the same length in every row.

    embeds [B, n, D]; valid [B, n] bool (real tokens); causal: text (True) or an image block;
    offsets [n] long: each token's RoPE position after the segment's start (arange for text,
    zeros for an image block); advance [B] long: how far the next segment's start moves;
    generation (start, stop): the positions in the segment the generation expert takes, a
    half-open range ((0, 0): none). Plain integers, not a mask: which expert takes a token
    follows from the layout alone, so routing needs no data-dependent op (`nonzero`) and the
    planner can trace a forward on fake tensors."""

    embeds: torch.Tensor
    valid: torch.Tensor
    causal: bool
    offsets: torch.Tensor
    advance: torch.Tensor
    generation: tuple[int, int]


class Routing:
    """Which sequence positions each expert takes, and how to put its outputs back in order."""

    def __init__(self, generation: list[bool], device: torch.device):
        und = [i for i, g in enumerate(generation) if not g]
        gen = [i for i, g in enumerate(generation) if g]
        inverse = [0] * len(generation)
        for slot, position in enumerate(und + gen):
            inverse[position] = slot
        self.und = torch.tensor(und, dtype=torch.long, device=device)
        self.gen = torch.tensor(gen, dtype=torch.long, device=device)
        self.inverse = torch.tensor(inverse, dtype=torch.long, device=device)

    def __call__(self, x: torch.Tensor, und_fn, gen_fn) -> torch.Tensor:
        """`und_fn` on the understanding tokens, `gen_fn` on the generation tokens of x [B, S, ...],
        back in sequence order."""
        return torch.cat([und_fn(x[:, self.und]), gen_fn(x[:, self.gen])], dim=1)[:, self.inverse]


@dataclass
class Packed:
    x: torch.Tensor  # [B, S, D]
    mask: torch.Tensor  # [B, S, S] bool, True = may attend
    positions: torch.Tensor  # [B, S] long RoPE positions
    routing: Routing


def pack(segments: list[Segment]) -> Packed:
    """One sequence of the segments in order (module docstring)."""
    device = segments[0].embeds.device
    b = segments[0].embeds.shape[0]
    start = torch.zeros(b, dtype=torch.long, device=device)
    positions = []
    for seg in segments:
        positions.append(start[:, None] + seg.offsets.to(device)[None])
        start = start + seg.advance.to(device)
    ids = torch.cat([torch.full((s.embeds.shape[1],), i, device=device) for i, s in enumerate(segments)])
    causal = torch.cat([torch.full((s.embeds.shape[1],), s.causal, dtype=torch.bool, device=device) for s in segments])
    idx = torch.arange(ids.shape[0], device=device)
    earlier = ids[None, :] < ids[:, None]
    within = (ids[None, :] == ids[:, None]) & (~causal[:, None] | (idx[None, :] <= idx[:, None]))
    valid = torch.cat([s.valid.to(device).bool() for s in segments], dim=1)
    mask = (earlier | within)[None] & valid[:, None, :]
    mask = mask | torch.eye(ids.shape[0], dtype=torch.bool, device=device)[None]
    generation = []
    for s in segments:
        start, stop = s.generation
        generation += [start <= i < stop for i in range(s.embeds.shape[1])]
    return Packed(torch.cat([s.embeds for s in segments], dim=1), mask, torch.cat(positions, dim=1),
                  Routing(generation, device))


def image_block(inner: torch.Tensor, markers: torch.Tensor, present: torch.Tensor, generation: bool = True) -> Segment:
    """`<|vision_start|> inner <|vision_end|>` as one image block: inner [B, n, D] (VAE latents,
    `generation=True`, or ViT tokens), the markers' embeddings [B, 2, D] (understanding expert),
    present [B] bool (False: the row has no such image; the block is padding)."""
    b, n, _ = inner.shape
    device = inner.device
    return Segment(torch.cat([markers[:, :1], inner, markers[:, 1:]], dim=1), present[:, None].expand(b, n + 2),
                   False, torch.zeros(n + 2, dtype=torch.long, device=device), present.long(),
                   (1, n + 1) if generation else (0, 0))
