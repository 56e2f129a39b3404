"""`RolloutEngine`: the contract every rollout engine implements, diffusion and text alike.

- `submit_many(requests) -> futures` queues requests; `wait(requests, futures, timeout_s)`
  returns their results in request order, raising (never hanging) on a failure or when
  `timeout_s` passes; `generate(requests, timeout_s)` is the two in one call. A future completes
  as soon as its sample is done, which is how the reward scorer overlaps the rollout.
- `sync_weights(source_model, version)` makes the engine sample from `source_model`'s current
  weights and records `version` in `weight_version`.
- `same_log_probs_as(model)`: whether the engine's recorded log-probs are, by construction, the
  ones the trainer computes for `model`'s current weights (the same model object in this
  process, the same function, fp32). Then the trainer need not recompute them; anywhere else
  (another process or copy, other kernels or precision) the answer is False and it does.
- `close()` stops the engine; its pending requests fail.

Left for the rollout-backend work: weight updates as streams of named tensors, sleep / wake,
engines in their own process.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Sequence


class RolloutEngine(ABC):
    weight_version: int = 0

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
    def sync_weights(self, source_model, version: int) -> None:
        ...

    def same_log_probs_as(self, model) -> bool:
        return False

    def close(self) -> None:
        pass
