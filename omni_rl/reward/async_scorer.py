"""Scoring that overlaps rollout: samples are scored in micro-batches as they finish.

`AsyncRewardScorer.submit(sample, prompt, metadata)` queues a sample and returns a future; worker
threads batch queued samples into the `RewardManager`, and `gather` rebuilds the step's
`RewardOutput` (raising `RewardError` past its `timeout_s`).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch

from omni_rl.reward.manager import RewardError, RewardManager, RewardOutput
from omni_rl.reward.scores import detail_pairs, group_means
from omni_rl.reward.media import MediaSamples


@dataclass
class SampleReward:
    """One sample's rewards: the weighted total, each successful reward's raw score, and the
    group and details of the sample under each reward that reports them (`omni_rl.reward.scores`)."""

    total: float
    per_reward: dict[str, float]
    failed: tuple[str, ...]
    groups: dict[str, str] = field(default_factory=dict)
    details: dict[str, dict] = field(default_factory=dict)


def _stack(samples: list[Any]) -> Any:
    if isinstance(samples[0], MediaSamples):  # one-sample MediaSamples (MediaSamples.split)
        return MediaSamples.cat(samples)
    if isinstance(samples[0], torch.Tensor):
        return torch.stack(samples)
    return list(samples)  # PIL images or texts: the reward inputs take lists


class AsyncRewardScorer:
    def __init__(self, manager: RewardManager, max_batch_size: int = 32, max_wait_ms: float = 20.0, num_threads: int = 1):
        if max_batch_size < 1 or max_wait_ms < 0 or num_threads < 1:
            raise ValueError(
                f"max_batch_size={max_batch_size}, max_wait_ms={max_wait_ms}, num_threads={num_threads}: "
                f"expected >= 1, >= 0 and >= 1"
            )
        self.manager = manager
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.batches_scored = 0
        self._queue: list[tuple[Any, str, dict, Future]] = []
        self._cv = threading.Condition()
        self._closed = False
        # Several threads score several micro-batches at once (with reward workers on Ray).
        self._threads = [
            threading.Thread(target=self._loop, name=f"omni-rl-rewards-{i}", daemon=True) for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, sample: Any, prompt: str, metadata: dict, future: Optional[Future] = None) -> Future:
        future = future or Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the reward scorer is closed")
            self._queue.append((sample, prompt, metadata, future))
            self._cv.notify_all()
        return future

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed and not self._queue:
                    return
                deadline = time.monotonic() + self.max_wait_s
                while len(self._queue) < self.max_batch_size and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(timeout=left)
                batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
            self._score(batch)

    def _score(self, batch: list[tuple[Any, str, dict, Future]]) -> None:
        try:
            out = self.manager.score(_stack([b[0] for b in batch]), [b[1] for b in batch], [b[2] for b in batch])
        except BaseException as err:  # noqa: BLE001 (the caller of gather sees it)
            for *_, fut in batch:
                fut.set_exception(err)
            return
        with self._cv:
            self.batches_scored += 1
        for i, (*_, fut) in enumerate(batch):
            fut.set_result(
                SampleReward(
                    total=float(out.total[i]),
                    per_reward={name: float(v[i]) for name, v in out.per_reward.items()},
                    failed=tuple(out.failed),
                    groups={name: keys[i] for name, keys in out.groups.items() if keys[i] is not None},
                    details={name: d[i] for name, d in out.details.items()},
                )
            )

    def gather(self, futures: Sequence[Future], timeout_s: float) -> RewardOutput:
        """Wait for a step's sample futures; the step's rewards with metrics over all samples."""
        deadline = time.monotonic() + timeout_s
        results: list[SampleReward] = []
        for i, fut in enumerate(futures):
            try:
                results.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                raise RewardError(self._timeout_message(i, timeout_s)) from None
        return combine(self.manager, results)

    def _timeout_message(self, index: int, timeout_s: float) -> str:
        """Which rewards the step waited for: those the manager says are running now
        (`running()`), else every configured one (`describe(name)`)."""
        now = self.manager.running()
        if now:
            waiting = "still running: " + ", ".join(f"reward {what} for {secs:.0f} s" for what, secs in now)
        else:
            names = [self.manager.describe(spec.name) for spec in self.manager.specs]
            waiting = "waiting for reward(s) " + ", ".join(names)
        return (
            f"scoring sample {index} took longer than {timeout_s:g} s (reward.timeout_s); {waiting}. "
            f"Raise reward.timeout_s if the reward is only slow, or give a remote reward a shorter "
            f"timeout_s of its own so it fails with its own error"
        )


def combine(manager: RewardManager, results: Sequence[SampleReward]) -> RewardOutput:
    total = np.array([r.total for r in results], dtype=np.float64)
    per_reward: dict[str, torch.Tensor] = {}
    metrics: dict[str, float] = {}
    failed: list[str] = []
    for spec in manager.specs:
        scores = np.array([r.per_reward[spec.name] for r in results if spec.name in r.per_reward])
        if len(scores) == len(results):
            per_reward[spec.name] = torch.from_numpy(scores.astype(np.float32))
        if len(scores):
            metrics[f"reward/{spec.name}/mean"] = float(scores.mean())
            metrics[f"reward/{spec.name}/std"] = float(scores.std())
        if not spec.required:
            fraction = sum(spec.name in r.failed for r in results) / len(results)
            metrics[f"reward/{spec.name}/failed"] = fraction
            if fraction > 0:
                failed.append(spec.name)
    metrics["reward/total/mean"] = float(total.mean())
    metrics["reward/total/std"] = float(total.std())
    groups: dict[str, list] = {}
    details: dict[str, list] = {}
    for spec in manager.specs:  # per-group means over the whole step (`reward/<group>`)
        if any(spec.name in r.groups for r in results):
            groups[spec.name] = [r.groups.get(spec.name) for r in results]
        if all(spec.name in r.details for r in results):
            details[spec.name] = [r.details[spec.name] for r in results]
        metrics.update(group_means([(r.groups[spec.name], r.per_reward[spec.name]) for r in results
                                    if spec.name in r.groups and spec.name in r.per_reward]))
        metrics.update(group_means(detail_pairs(
            [r.groups.get(spec.name) for r in results if spec.name in r.details],
            [r.details[spec.name] for r in results if spec.name in r.details])))
    return RewardOutput(total=torch.from_numpy(total.astype(np.float32)), per_reward=per_reward, metrics=metrics,
                        failed=failed, groups=groups, details=details)
