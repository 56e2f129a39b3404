"""`scored_rollout`: run a step's requests on a rollout engine and hand every finished sample to
the reward scorer the moment the engine completes it (each sample for the native diffusion
engine, a chunk for Ray, all at once for the synchronous text engine). Every family's `rollout`
uses it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Optional

# reward_input(result, prompt, metadata) -> (sample, prompt, metadata): what the rewards score.
RewardInput = Callable[[Any, str, dict], tuple[Any, str, dict]]


def scored_rollout(
    engine: Any,
    requests: Sequence[Any],
    prompts: Sequence[str],
    metadata: Sequence[dict],
    score: Optional[Callable[..., Any]],
    reward_input: RewardInput,
    timeout_s: float,
) -> tuple[list[Any], list[Future]]:
    """The results in request order and, with `score(sample, prompt, metadata, future)`, one
    reward future per request (an empty list without `score`)."""
    futures = engine.submit_many(requests)
    reward_futures: list[Future] = []
    if score is not None:
        for fut, prompt, meta in zip(futures, prompts, metadata):
            reward_futures.append(Future())
            fut.add_done_callback(_hand_over(score, reward_input, prompt, meta, reward_futures[-1]))
    return engine.wait(requests, futures, timeout_s=timeout_s), reward_futures


def _hand_over(score, reward_input: RewardInput, prompt: str, metadata: dict, reward_future: Future):
    def done(fut: Future) -> None:
        if fut.exception() is None:  # a failed sample fails the rollout itself, not here
            score(*reward_input(fut.result(), prompt, metadata), reward_future)

    return done
