"""How the native text engines batch prompts and draw a token: shared by the single-turn decode
(`text_native`) and the multi-turn one (`text_turns`), so that a turn's tokens are drawn and scored
exactly as a single response's are. The recorded log-prob is the trainer's:
`log_softmax(logits / temperature)` in fp32 over the full tempered distribution (top-p changes
which token is drawn, never its recorded probability); temperature 0 is greedy."""
from __future__ import annotations

from typing import Sequence

import torch

from omni_rl.rollout.text_types import TextRequest


def collate_media(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate per-prompt processor tensors along their first dimension."""
    if not parts or not parts[0]:
        return {}
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def join_media(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One sample's media from its pieces (the prompt's, then each fed image's), in order; empty
    pieces are skipped, the others must have the same keys."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    for p in parts[1:]:
        if set(p) != set(parts[0]):
            raise ValueError(f"media pieces with keys {sorted(p)} and {sorted(parts[0])} cannot be joined; a model that "
                             f"reads images in a conversation gives every piece the keys of encode_prompt")
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def left_pad(sequences: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, width - len(s):] = s
        mask[i, width - len(s):] = 1
    return ids, mask


def sample_top_p(logits: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """Draw one token from tempered logits [V], keeping the smallest set of mass >= top_p."""
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep a token if the mass before it is < top_p (the first token always stays).
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
        filtered = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        probs = filtered / filtered.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def draw_token(logits: torch.Tensor, req: TextRequest, generator: torch.Generator) -> tuple[int, float]:
    """The next token of `req` from its last position's logits [V], and its recorded log-prob."""
    if req.temperature == 0:
        tempered = logits.float()
        token = int(tempered.argmax())
    else:
        tempered = logits.float() / req.temperature
        token = sample_top_p(tempered, req.top_p, generator)
    return token, float(torch.log_softmax(tempered, dim=-1)[token])
