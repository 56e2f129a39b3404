"""Multi-turn decoding for the native text engine: each trajectory's turns continue one KV cache.

A batch of trajectories is decoded together. A row is sampling a model turn, waiting for what
follows its turn (`TurnHandler.end_turn`: a tool's or an environment's answer, computed off this
thread and handed back as a future), or done. Every forward feeds each row what it has: the token
it just sampled, the whole answer it was handed (teacher-forced: a prefill of that row only), or
nothing (a masked pad column). So trajectories at different turns share forwards, no prefix is
encoded twice, and a slow tool holds up its own trajectory only. Positions come from the
attention mask, so a waiting row's pad columns do not shift its positions: the trainer's forward
over the packed trajectory sees the same positions and the same tokens.

The fed tokens are in the result's `response_ids` with log-prob 0 and `response_mask` 0: they
are context, not actions. A feed may carry images (`TurnFeed.media`, for a model that
`takes_images`): the forward that feeds it gets their tensors, so the vision features enter at
their placeholder tokens, and the result's `response_media` keeps them for the trainer's forward. Not here: what a turn means (tool calls, environments, turn limits),
which is `omni_rl.agent`'s; routed-expert recording (an agent run refuses it at load).
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Optional, Protocol, Sequence

import torch

from omni_rl.models.autoregressive import AutoregressiveModelBase, positions_from_mask
from omni_rl.rollout.text_sampling import collate_media, draw_token, join_media, left_pad
from omni_rl.rollout.text_types import TextRequest, TextResult, TurnFeed


class TurnHandler(Protocol):
    def end_turn(self, request_id: int, turn_ids: list[int], finish_reason: str, room: int) -> Future:
        """A model turn of request `request_id` ended: `turn_ids` (its sampled tokens),
        `finish_reason` "stop" (a stop token), "length" (the turn's max_new_tokens) or
        "max_total_tokens" (the trajectory's budget); `room`: how many more tokens the trajectory
        may hold. The future gives what to feed before the next model turn (at most `room`
        tokens): a `TurnFeed` (or its token ids alone), or None when the trajectory ends; it must
        complete in bounded time."""


def decode_turns(
    model: AutoregressiveModelBase, batch: Sequence[TextRequest], handler: TurnHandler, max_total_tokens: int,
    weight_version: int, stats: dict,
) -> list[TextResult]:
    """Decode the trajectories of `batch` (one request each) to their ends; results in order.
    Tokens are drawn by `text_sampling.draw_token`, as a single-turn response's are."""
    n = len(batch)
    ids, mask = left_pad([r.prompt.input_ids for r in batch], model.pad_token_id)
    media = collate_media([r.prompt.media for r in batch])
    generators = [torch.Generator().manual_seed(r.seed) for r in batch]
    stops = [set(model.eos_token_ids) | set(r.stop_token_ids) for r in batch]
    tokens: list[list[int]] = [[] for _ in range(n)]
    log_probs: list[list[float]] = [[] for _ in range(n)]
    sampled: list[list[float]] = [[] for _ in range(n)]
    turn: list[list[int]] = [[] for _ in range(n)]
    fed_media: list[list[dict]] = [[] for _ in range(n)]  # each row's fed images, in order
    last_reason = ["stop"] * n
    state = ["sample"] * n  # sample | wait | done
    waiting: dict[int, Future] = {}

    use_cache = model.supports_kv_cache
    cache = model.new_cache() if use_cache else None
    logits, cache = model.forward_logits(ids, mask, media, cache=cache, logits_to_keep=1)
    stats["forwards"] += 1
    last = logits[:, -1]
    while True:
        feeds: list[list[int]] = [[] for _ in range(n)]
        feed_media: list[dict] = [{} for _ in range(n)]
        for i, req in enumerate(batch):
            if state[i] != "sample":
                continue
            token, log_prob = draw_token(last[i], req, generators[i])
            tokens[i].append(token)
            log_probs[i].append(log_prob)
            sampled[i].append(1.0)
            turn[i].append(token)
            feeds[i] = [token]
            if token in stops[i]:
                reason = "stop"
            elif len(turn[i]) >= req.max_new_tokens:
                reason = "length"
            elif len(tokens[i]) >= max_total_tokens:
                reason = "max_total_tokens"
            else:
                continue
            last_reason[i] = reason
            waiting[i] = handler.end_turn(req.request_id, list(turn[i]), reason, max_total_tokens - len(tokens[i]))
            turn[i] = []
            state[i] = "wait"
        ready = [i for i, future in waiting.items() if future.done()]
        if not ready and waiting and not any(feeds):
            # Every live row waits on its tool: block until one answers (each answer is bounded
            # in time by the handler's own timeouts).
            wait(list(waiting.values()), return_when=FIRST_COMPLETED)
            ready = [i for i, future in waiting.items() if future.done()]
        for i in ready:
            answer: Optional[TurnFeed | list[int]] = waiting.pop(i).result()
            if answer is None:
                state[i] = "done"
                continue
            feed = answer if isinstance(answer, TurnFeed) else TurnFeed(list(answer))
            tokens[i].extend(feed.ids)
            log_probs[i].extend([0.0] * len(feed.ids))
            sampled[i].extend([0.0] * len(feed.ids))
            feeds[i] = feeds[i] + list(feed.ids)
            if feed.media:
                feed_media[i] = feed.media
                fed_media[i].append(feed.media)
            state[i] = "sample"
        if all(s == "done" for s in state):
            break
        if not any(feeds):
            continue
        # Each row's fed tokens right-aligned, so the last column holds every feeding row's
        # newest token: the one whose logits its next sample is drawn from.
        width = max(len(f) for f in feeds)
        new = torch.full((n, width), model.pad_token_id, dtype=torch.long)
        new_mask = torch.zeros((n, width), dtype=torch.long)
        for i, feed in enumerate(feeds):
            if feed:
                new[i, width - len(feed):] = torch.tensor(feed, dtype=torch.long)
                new_mask[i, width - len(feed):] = 1
        mask = torch.cat([mask, new_mask], 1)
        if use_cache:
            # This forward's images, row by row: the order their placeholder runs have in `new`.
            new_media = join_media(feed_media) or None
            logits, cache = model.forward_logits(
                new, mask, media=new_media, cache=cache, position_ids=positions_from_mask(mask)[:, -width:],
                logits_to_keep=1)
        else:
            ids = torch.cat([ids, new], 1)
            media = join_media([join_media([req.prompt.media, *fed_media[i]]) for i, req in enumerate(batch)])
            logits, _ = model.forward_logits(ids, mask, media, logits_to_keep=1)
        stats["forwards"] += 1
        last = logits[:, -1]
    stats["samples"] += n
    return [
        TextResult(
            request_id=req.request_id, prompt=req.prompt,
            response_ids=torch.tensor(tokens[i], dtype=torch.long),
            log_probs=torch.tensor(log_probs[i], dtype=torch.float32),
            finish_reason=last_reason[i], text=model.decode_tokens(tokens[i]),
            temperature=req.temperature, top_p=req.top_p, weight_version=weight_version,
            response_mask=torch.tensor(sampled[i], dtype=torch.float32), response_media=join_media(fed_media[i]),
        )
        for i, req in enumerate(batch)
    ]
