"""`RayRolloutEngine`: the driver's rollout engine when the samplers are Ray workers.

Rank r gets the r-th contiguous shard of the requests in calls of at most `chunk_size`, and each
chunk's futures complete the moment it is back, so rewards score while workers sample. Requests
are seeded per sample, so where one runs does not change it; results return on the host.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from omni_rl.rollout.base import RolloutEngine
from omni_rl.workers import programs
from omni_rl.utils.shards import split_evenly
from omni_rl.workers.worker_group import WorkerGroup


class RayRolloutEngine(RolloutEngine):
    def __init__(self, group: WorkerGroup, timeout_s: float, chunk_size: int):
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size}: expected >= 1 requests per call")
        self.group = group
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self.weight_version = 0
        self._inflight: tuple[list[Future], list, list[tuple[int, int]], list[int]] | None = None

    def submit_many(self, requests: Sequence[Any]) -> list[Future]:
        """Send every chunk to its rank now; the futures complete in `wait`."""
        if self._inflight is not None:
            raise RuntimeError("RayRolloutEngine: a submission is still in flight; wait for it first")
        calls, spans = [], []
        for rank, (lo, hi) in enumerate(split_evenly(len(requests), self.group.world_size)):
            for a in range(lo, hi, self.chunk_size):
                b = min(a + self.chunk_size, hi)
                calls.append((rank, (list(requests[a:b]), self.timeout_s)))
                spans.append((a, b))
        futures: list[Future] = [Future() for _ in requests]
        refs = self.group.submit("rollout", programs.generate, calls)
        self._inflight = (futures, refs, spans, [rank for rank, _ in calls])
        return futures

    def wait(self, requests: Sequence[Any], futures: Sequence[Future], timeout_s: float) -> list[Any]:
        """Complete `futures` chunk by chunk as the workers return them (their callbacks run
        here, on the driver's thread); a failed worker fails every future still pending.
        `timeout_s` is the engine interface's: here each worker's engine waits
        `rollout.timeout_s` and the group gives up after `trainer.backend_options.worker_timeout_s`."""
        if self._inflight is None or self._inflight[0] is not futures:
            raise RuntimeError("RayRolloutEngine.wait: these futures are not the submission in flight")
        _, refs, spans, ranks = self._inflight
        self._inflight = None
        try:
            for i, results in self.group.as_completed(refs, "rollout", ranks=ranks):
                a, b = spans[i]
                for fut, res in zip(futures[a:b], results):
                    fut.set_result(res)
        except BaseException as err:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(err)
            raise
        return [f.result() for f in futures]

    def generate(self, requests: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
        if not requests:
            return []
        return self.wait(requests, self.submit_many(requests), self.timeout_s)

    def sync_weights(self, source_model, version: int) -> None:
        """After an update: every worker's rollout copy takes its actor's new weights (each rank
        syncs from its own shards; `source_model`, the driver's weightless view, holds none)."""
        self.group.run("weight sync", programs.sync_rollout, [(version,)] * self.group.world_size)
        self.weight_version = version

    def update_weights(self, tensors, version: int, kind: str) -> None:
        raise NotImplementedError(
            "RayRolloutEngine takes no tensors from the driver: each worker's rollout copy syncs from its own "
            "actor shards (sync_weights)"
        )
