"""Multi-turn decoding on vLLM (`VllmTextEngine.generate_turns`): each turn a request of its own
whose prompt is the trajectory so far, its KV reused through vLLM's prefix cache.

Every trajectory's next model turn is added to vLLM's engine (`LLMEngine.add_request`) as soon as
the `TurnHandler` answers its last one, while the engine steps the others (`LLMEngine.step`): so
trajectories at different turns share vLLM's steps, and a slow tool holds up its own trajectory
only. A turn's prompt is the prompt, every sampled token and every fed token before it; vLLM's
prefix cache finds the blocks it already holds for that prefix (its KV was computed when the
earlier turns were sampled) and encodes only the rest: each result's `extras` counts the prompt
tokens of its continued turns and how many of them the cache served (vLLM's `num_cached_tokens`).

The tokens and the fed turns go into the result as the native engine puts them
(`rollout/text_turns.py`): fed tokens with log-prob 0 and `response_mask` 0. A turn's seed is
derived from the request's seed and the turn's index. Not here: routed experts (an agent run
refuses routing replay at load), media prompts.
"""
from __future__ import annotations

import itertools
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable, Optional, Sequence

import torch

from omni_rl.rollout.text_types import TextRequest, TextResult
from omni_rl.utils.seeding import derive_seed

_turn_ids = itertools.count()


def turn_seed(seed: int, turn: int) -> int:
    """The seed of turn `turn` of a trajectory seeded `seed` (turn 0 keeps the request's own)."""
    return seed if turn == 0 else derive_seed(seed, "turn", turn) % (2**31 - 1)


def turn_reason(finish_reason: Optional[str], turn_length: int, max_new_tokens: int) -> str:
    """The `TurnHandler`'s finish reason of a turn vLLM ended: a stop token, the turn's
    max_new_tokens, or the trajectory's budget (the turn's max_tokens was its room)."""
    if finish_reason == "stop":
        return "stop"
    if finish_reason != "length":
        raise RuntimeError(f"vLLM ended a turn with finish_reason={finish_reason!r}; expected stop or length")
    return "length" if turn_length >= max_new_tokens else "max_total_tokens"


def decode_turns_vllm(
    engine, requests: Sequence[TextRequest], handler, max_total_tokens: int, params_for: Callable[[TextRequest, int, int], Any],
    log_probs_of: Callable[[TextRequest, list[int], Any], list[float]], decode: Callable[[list[int]], str],
    weight_version: int, stats: dict, lora_request=None,
) -> list[TextResult]:
    """Decode the trajectories of `requests` (one each) to their ends on vLLM's `LLMEngine`
    `engine`, which must be idle; results in request order. `params_for(req, turn, max_tokens)`
    makes a turn's `SamplingParams`; `log_probs_of(req, token_ids, logprobs)` reads a completion's."""
    if engine.has_unfinished_requests():
        raise RuntimeError("generate_turns: vLLM's engine has unfinished requests; it runs one call at a time")
    n = len(requests)
    prompts = [r.prompt.input_ids.tolist() for r in requests]
    tokens: list[list[int]] = [[] for _ in range(n)]
    log_probs: list[list[float]] = [[] for _ in range(n)]
    sampled: list[list[float]] = [[] for _ in range(n)]
    turn = [0] * n
    last_reason = ["stop"] * n
    extras = [{"turns": 0, "continued_prompt_tokens": 0, "prefix_cached_tokens": 0} for _ in range(n)]
    live: dict[str, int] = {}  # vLLM request id -> row
    waiting: dict[int, Future] = {}

    def submit(i: int) -> None:
        req = requests[i]
        room = max_total_tokens - len(tokens[i])
        rid = f"omni-rl-turn-{next(_turn_ids)}-{req.request_id}-{turn[i]}"
        engine.add_request(rid, {"prompt_token_ids": prompts[i] + tokens[i]},
                           params_for(req, turn[i], min(req.max_new_tokens, room)), lora_request=lora_request)
        live[rid] = i

    for i in range(n):
        submit(i)
    try:
        while live or waiting:
            if live:
                turns_running = {turn[i] for i in live.values()}
                outputs = engine.step()
                stats["turn_steps"] += 1
                stats["mixed_turn_steps"] += len(turns_running) > 1
                for out in outputs:
                    if not out.finished:
                        continue
                    i = live.pop(out.request_id)
                    req, done = requests[i], out.outputs[0]
                    ids = list(done.token_ids)
                    if not ids:
                        raise RuntimeError(f"request {req.request_id}: vLLM ended turn {turn[i]} with no token "
                                           f"(finish_reason={done.finish_reason!r})")
                    if turn[i] > 0:
                        extras[i]["continued_prompt_tokens"] += len(out.prompt_token_ids)
                        extras[i]["prefix_cached_tokens"] += int(out.num_cached_tokens or 0)
                    extras[i]["turns"] += 1
                    tokens[i] += ids
                    log_probs[i] += log_probs_of(req, ids, done.logprobs or [])
                    sampled[i] += [1.0] * len(ids)
                    reason = turn_reason(done.finish_reason, len(ids), req.max_new_tokens)
                    last_reason[i] = reason
                    waiting[i] = handler.end_turn(req.request_id, ids, reason, max_total_tokens - len(tokens[i]))
                    turn[i] += 1
            elif waiting:
                # Every live trajectory waits on its tools (each answer is bounded in time by the
                # handler's own timeouts).
                wait(list(waiting.values()), return_when=FIRST_COMPLETED)
            for i in [i for i, future in waiting.items() if future.done()]:
                answer: Optional[list[int]] = waiting.pop(i).result()
                if answer is None:
                    continue
                tokens[i] += list(answer)
                log_probs[i] += [0.0] * len(answer)
                sampled[i] += [0.0] * len(answer)
                submit(i)
    except BaseException:
        if live:
            engine.abort_request(list(live), internal=False)
        raise
    for e in extras:
        stats["continued_prompt_tokens"] += e["continued_prompt_tokens"]
        stats["prefix_cached_tokens"] += e["prefix_cached_tokens"]
    stats["samples"] += n
    return [
        TextResult(
            request_id=req.request_id, prompt=req.prompt, response_ids=torch.tensor(tokens[i], dtype=torch.long),
            log_probs=torch.tensor(log_probs[i], dtype=torch.float32), finish_reason=last_reason[i],
            text=decode(tokens[i]), temperature=req.temperature, top_p=req.top_p, weight_version=weight_version,
            response_mask=torch.tensor(sampled[i], dtype=torch.float32), extras=dict(extras[i]),
        )
        for i, req in enumerate(requests)
    ]
