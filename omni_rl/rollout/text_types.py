"""Requests and results of text (autoregressive) rollout engines.

One request is one sampled response: its own prompt, seed and sampling settings. Tokens are
drawn from a generator seeded by the request alone, so a response does not depend on what it
was batched with (up to float reduction order in the shared forward).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch

from omni_rl.models.autoregressive import PromptInputs

_ids = itertools.count()


@dataclass
class TextRequest:
    prompt: PromptInputs
    seed: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    # Extra stop tokens besides the model's end-of-turn tokens.
    stop_token_ids: tuple[int, ...] = ()
    # Record a mixture-of-experts model's routed experts into the result (`TextResult.routes`):
    # what algo.family_options.routing_replay=r3 replays; off by default, as they take
    # layers x top_k bytes per token (Qwen3-30B-A3B: 48 x 8 = 384, ~20x the rest of a token's trajectory).
    record_routes: bool = False
    request_id: int = field(default_factory=lambda: next(_ids))

    def batch_key(self) -> tuple:
        """Requests with equal keys share forwards: the same kinds of media tensors."""
        return tuple(sorted(self.prompt.media))


@dataclass
class TextResult:
    """One finished response.

    response_ids: [R] long, the sampled tokens (the stop token included when one was hit)
    log_probs:    [R] fp32, log_softmax(logits / temperature) of each sampled token
    finish_reason: "stop" (a stop token) or "length" (truncated at max_new_tokens)
    response_mask: [R] float or None: 1 on the tokens the model sampled, 0 on tokens it was fed
                  between its turns (a tool's or an environment's answer, `omni_rl.agent`); None: every
                  token was sampled
    response_media: the processor tensors of images fed in the response (their placeholder
                  tokens are among the fed ones), keyed as the prompt's media; {} when none
    routes:       [S, L, k] a mixture-of-experts model's routed experts (`moe_routing.route_dtype`)
                  of the first S tokens of prompt + response, per MoE layer; S >= P + R - 1 (the
                  last response token is fed to no forward that scores another); None when the
                  model is dense or the engine does not record them
    """

    request_id: int
    prompt: PromptInputs
    response_ids: torch.Tensor
    log_probs: torch.Tensor
    finish_reason: str
    text: str
    temperature: float
    top_p: float = 1.0
    extras: Optional[dict] = None
    # The engine's weight_version when the response was sampled (None: an engine that does not say).
    weight_version: Optional[int] = None
    routes: Optional[torch.Tensor] = None
    response_mask: Optional[torch.Tensor] = None
    # The media tensors of the images fed inside the response (an agent's tool turns), in order,
    # with the prompt's keys: the trainer's forward of prompt + response takes both, joined.
    response_media: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class TurnFeed:
    """What a multi-turn decode feeds a trajectory between two model turns: token ids and, for a
    model that reads images in a conversation, the media tensors of the images their placeholder
    runs stand for (`AutoregressiveModelBase.encode_media_text`; empty: text only)."""

    ids: list[int]
    media: dict[str, torch.Tensor] = field(default_factory=dict)
