"""`RolloutEngine`: the contract every rollout engine implements, diffusion and text alike.

`submit_many` / `wait` / `generate` sample (raising, never hanging), `update_weights` loads named
tensors, and an engine declares `shares_model_with` / `same_log_probs_as`, checks requests and
sleeps, wakes and closes. docs/extending/rollout-backend.md shows one.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from concurrent.futures import Future, TimeoutError as FutureTimeout
from types import MappingProxyType
from typing import Any, Optional, Sequence

import torch

from omni_rl.errors import OmniRunError
from omni_rl.utils.tensor_buckets import NamedTensors

WEIGHT_KINDS = ("lora", "full")


def weight_kind(model) -> str:
    """What `model.named_trainable_tensors()` holds: LoRA tensors only, or the full weights."""
    return "lora" if model.cfg.lora.enabled else "full"


def weight_versions_of(results: Sequence[Any]):
    """[N] long tensor: each result's `weight_version`, -1 where the engine did not say."""
    return torch.tensor([-1 if r.weight_version is None else int(r.weight_version) for r in results], dtype=torch.long)


def check_weight_kind(kind: str) -> None:
    if kind not in WEIGHT_KINDS:
        raise ValueError(f"update_weights: kind={kind!r}, expected one of {list(WEIGHT_KINDS)}")


class RolloutEngineError(OmniRunError):
    """The engine failed or timed out; the message says which requests and why."""


def wait_results(requests: Sequence, futures: Sequence[Future], timeout_s: float) -> list:
    """The futures' results in request order, within `timeout_s` for them all; a failure or a
    timeout raises `RolloutEngineError` naming the request (any engine whose futures complete
    on their own uses this for its `wait`)."""
    deadline = time.monotonic() + timeout_s
    results = []
    for req, fut in zip(requests, futures):
        try:
            results.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            raise RolloutEngineError(
                f"rollout timed out after {timeout_s:.0f} s waiting for request {req.request_id} "
                f"(prompt {req.prompt!r}); raise rollout.timeout_s if the model is just slow"
            ) from None
        except Exception as err:
            raise RolloutEngineError(
                f"rollout failed for request {req.request_id} (prompt {req.prompt!r}): {err!r}"
            ) from err
    return results


class RolloutEngine(ABC):
    weight_version: int = 0
    stats: Mapping[str, Any] = MappingProxyType({})

    @abstractmethod
    def submit_many(self, requests: Sequence[Any]) -> list[Future]:
        ...

    @abstractmethod
    def wait(self, requests: Sequence[Any], futures: Sequence[Future], timeout_s: float) -> list[Any]:
        ...

    def generate(self, requests: Sequence[Any], timeout_s: float = 1800.0) -> list[Any]:
        """Submit all requests at once and wait for them (results in request order)."""
        if not requests:
            return []
        return self.wait(requests, self.submit_many(requests), timeout_s)

    @abstractmethod
    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        ...

    def shares_model_with(self, model) -> bool:
        """Whether this engine samples with `model` itself (the same object), so that a change to
        `model`'s weights is already the engine's. An engine with a copy of its own, in this
        process or another, says False: its weights change only through `update_weights`."""
        return False

    def sync_weights(self, source_model, version: int) -> None:
        """Make the engine sample from `source_model`'s current weights."""
        if self.shares_model_with(source_model):
            self.weight_version = version  # the trainer's model itself: already current
            return
        self.update_weights(source_model.named_trainable_tensors(), version, weight_kind(source_model))

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def same_log_probs_as(self, model) -> bool:
        return False

    def check_request(self, request: Any) -> None:
        """Raise ValueError naming the field of a request this engine cannot sample, at submission, so a
        bad request fails its own caller and no one else's. The default checks nothing.
        """

    def failure(self) -> Optional[str]:
        """Why the engine can no longer sample (it stopped after an error, or was closed); None
        while it can. The rollout server's /health reports it."""
        return None

    def close(self) -> None:
        pass


class SynchronousRolloutEngine(RolloutEngine):
    """An engine that samples a whole call at once (`generate`): `submit_many` runs it, so its
    futures are done when it returns, and `wait` reads them."""

    @abstractmethod
    def generate(self, requests: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
        ...

    def submit_many(self, requests: Sequence[Any]) -> list[Future]:
        futures = []
        for res in self.generate(requests):
            futures.append(Future())
            futures[-1].set_result(res)
        return futures

    def wait(self, requests: Sequence[Any], futures: Sequence[Future], timeout_s: float | None = None) -> list[Any]:
        return [f.result() for f in futures]
