"""`TextBatch`: a step's sampled responses, padded into one tensor, as the trainer passes them.

N samples; prompts left-padded to P columns, responses right-padded to R columns:

  sequences       [N, P + R] long   prompt tokens then response tokens
  attention_mask  [N, P + R] long   1 on real tokens
  response_mask   [N, R] float      1 on response tokens that count (the sampled ones; an agent's
                                    tool and environment turns are 0)
  rollout_log_probs / old_log_probs [N, R] fp32
  rollout_is_weights [N, R] fp32 or None: rollout-correction weights of the policy loss (algo.rollout_correction_options.level)
  media           one dict of processor tensors per sample (images, audio), collated per forward:
                  the prompt's, then those of images fed inside the response (an agent's tool turns)
  rewards, advantages [N];  group_index [N]
  weight_versions [N] long   the weight version each response was sampled with (-1: unknown)
  texts           the decoded responses (what rewards score)
  routes          [N, P + R, L, k] or None: a mixture-of-experts model's routed experts per token
                  and MoE layer as the rollout recorded them (smallest integer type), aligned with
                  `sequences`; route_mask [N, P + R] bool: 1 where a route was recorded
  old_routes      [N, P + R, L, k] or None: the routes of the trainer's own old-policy forward
                  (algo.family_options.routing_replay=r2), on every position
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from omni_rl.models.moe_routing import RoutingReplayError
from omni_rl.rollout.base import weight_versions_of
from omni_rl.rollout.text_sampling import join_media
from omni_rl.rollout.text_types import TextResult


@dataclass
class TextBatch:
    prompts: list[str]
    metadata: list[dict[str, Any]]
    group_index: torch.Tensor
    sequences: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor
    media: list[dict[str, torch.Tensor]]
    texts: list[str]
    finish_reasons: list[str]
    temperature: float
    prompt_width: int
    rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    rollout_is_weights: Optional[torch.Tensor] = None
    weight_versions: Optional[torch.Tensor] = None
    routes: Optional[torch.Tensor] = None
    route_mask: Optional[torch.Tensor] = None
    old_routes: Optional[torch.Tensor] = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.sequences.shape[0]

    @staticmethod
    def from_results(
        results: Sequence[TextResult], prompts: Sequence[str], metadata: Sequence[dict], group_index: Sequence[int],
        pad_id: int,
    ) -> "TextBatch":
        n = len(results)
        p_width = max(len(r.prompt.input_ids) for r in results)
        r_width = max(1, max(len(r.response_ids) for r in results))
        sequences = torch.full((n, p_width + r_width), pad_id, dtype=torch.long)
        attention = torch.zeros((n, p_width + r_width), dtype=torch.long)
        response_mask = torch.zeros((n, r_width), dtype=torch.float32)
        log_probs = torch.zeros((n, r_width), dtype=torch.float32)
        for i, r in enumerate(results):
            p, k = r.prompt.input_ids, len(r.response_ids)
            sequences[i, p_width - len(p): p_width] = p
            attention[i, p_width - len(p): p_width + k] = 1
            sequences[i, p_width: p_width + k] = r.response_ids
            # An agent's trajectory: the tool and environment turns between the model's are in the
            # context (attended) but are not actions (masked out of the loss and the log-prob checks).
            response_mask[i, :k] = 1 if r.response_mask is None else r.response_mask
            log_probs[i, :k] = r.log_probs
        routes, route_mask = _padded_routes(results, p_width, r_width)
        return TextBatch(
            prompts=list(prompts), metadata=[dict(m) for m in metadata],
            group_index=torch.as_tensor(list(group_index), dtype=torch.long),
            sequences=sequences, attention_mask=attention, response_mask=response_mask,
            rollout_log_probs=log_probs, media=[join_media([r.prompt.media, r.response_media]) for r in results],
            texts=[r.text for r in results], finish_reasons=[r.finish_reason for r in results],
            temperature=results[0].temperature, prompt_width=p_width,
            weight_versions=weight_versions_of(results), routes=routes, route_mask=route_mask,
        )

    def select(self, index: Sequence[int] | torch.Tensor) -> "TextBatch":
        idx = torch.as_tensor(index, dtype=torch.long)
        ids = idx.tolist()
        pick = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        return replace(
            self,
            prompts=[self.prompts[i] for i in ids], metadata=[self.metadata[i] for i in ids],
            group_index=pick(self.group_index), sequences=pick(self.sequences),
            attention_mask=pick(self.attention_mask), response_mask=pick(self.response_mask),
            rollout_log_probs=pick(self.rollout_log_probs), media=[self.media[i] for i in ids],
            texts=[self.texts[i] for i in ids], finish_reasons=[self.finish_reasons[i] for i in ids],
            rewards=pick(self.rewards), advantages=pick(self.advantages), old_log_probs=pick(self.old_log_probs),
            rollout_is_weights=pick(self.rollout_is_weights), weight_versions=pick(self.weight_versions),
            routes=pick(self.routes), route_mask=pick(self.route_mask), old_routes=pick(self.old_routes),
        )


def _padded_routes(results: Sequence[TextResult], p_width: int, r_width: int):
    """(routes [N, P + R, L, k], route_mask [N, P + R]) in the batch's columns, or (None, None)
    when no result has routes; a result without routes has an all-zero mask row (the trainer's
    replay refuses it, naming the sample)."""
    recorded = [(i, r.routes) for i, r in enumerate(results) if r.routes is not None]
    if not recorded:
        return None, None
    first_index, first = recorded[0]
    routes = torch.zeros((len(results), p_width + r_width, *first.shape[1:]), dtype=first.dtype)
    mask = torch.zeros((len(results), p_width + r_width), dtype=torch.bool)
    for i, r in recorded:
        if r.shape[1:] != first.shape[1:] or r.dtype != first.dtype:
            raise RoutingReplayError(
                f"sample {i}: routes of shape {tuple(r.shape)} ({r.dtype}), but sample {first_index}'s are "
                f"{tuple(first.shape)} ({first.dtype}); every sample of a batch must come from the same model")
        start = p_width - len(results[i].prompt.input_ids)
        s = min(len(r), p_width + r_width - start)
        routes[i, start : start + s] = r[:s]
        mask[i, start : start + s] = True
    return routes, mask
