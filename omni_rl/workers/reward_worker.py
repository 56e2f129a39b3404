"""Reward workers on Ray: reward models run in their own processes (and devices), apart from the
trainer.

`RayRewardManager` has the `RewardManager` interface and forwards each call, round robin, to one
of `num_workers` `RewardWorker` actors, each building the same manager, so the rules are
unchanged. A worker that dies or does not answer within `timeout_s` raises `RewardError` naming
it: the step fails, never hangs and never scores 0. Options: `reward.worker_options`
(`RewardWorkerOptions`, bound at load: `cfg.reward.worker_options` holds the instance).
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from omni_rl.option import ComponentOptions, option

from omni_rl.reward.manager import RewardError, RewardManager, RewardOutput, RewardSpec


class RewardWorker:
    """The Ray actor: one `RewardManager` in its own process."""

    def __init__(self, specs: list[RewardSpec], plugins: Sequence[str], metrics_only: bool = False):
        self.manager = RewardManager(specs, plugins=tuple(plugins), metrics_only=metrics_only)

    def info(self) -> dict[str, Any]:
        return {"node": socket.gethostname(), "pid": os.getpid()}

    def score(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return self.manager.score(samples, prompts, metadata)


@dataclass
class RewardWorkerOptions(ComponentOptions):
    """Reward workers on Ray (`reward.worker_options`)."""

    num_workers: int = option(0, "Reward workers on Ray (0 = score in the trainer process): each holds the reward models; micro-batches go to them round robin, several at once.")
    num_cpus: float = option(1.0, "CPUs each reward worker reserves.")
    num_gpus: float = option(0.0, "GPUs each reward worker reserves.")

    def check(self) -> None:
        if not self.num_workers >= 0:
            raise ValueError(f"num_workers={self.num_workers!r}: expected >= 0 (0 = in the trainer)")
        for name in ("num_cpus", "num_gpus"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected >= 0")


class RayRewardManager:
    def __init__(
        self, specs: Sequence[RewardSpec], plugins: Sequence[str] = (), num_workers: int = 1,
        timeout_s: float = 1800.0, num_cpus: float = 1.0, num_gpus: float = 0.0, metrics_only: bool = False,
    ):
        import ray

        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: expected >= 1 (0 means: use RewardManager in-process)")
        self.specs = tuple(specs)
        self.names = [s.name for s in self.specs]
        self.timeout_s = timeout_s
        actor = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(RewardWorker)
        self.workers = [actor.remote(list(self.specs), list(plugins), metrics_only) for _ in range(num_workers)]
        self.infos = [{"node": "?", "pid": "?"} for _ in self.workers]
        for i, info in enumerate(self._get([w.info.remote() for w in self.workers], "start")):
            self.infos[i] = info
        self._next = itertools.cycle(range(num_workers))
        self._lock = threading.Lock()

    def _describe(self, i: int) -> str:
        info = self.infos[i]
        return f"reward worker {i} (node {info['node']}, pid {info['pid']})"

    def _get(self, refs, what: str, index: int | None = None):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(refs, timeout=self.timeout_s)
        except GetTimeoutError:
            who = self._describe(index) if index is not None else "reward workers"
            raise RewardError(f"{who} did not {what} within {self.timeout_s:.0f} s (reward.timeout_s)") from None
        except RayActorError as err:
            who = self._describe(index) if index is not None else "a reward worker"
            raise RewardError(f"{who} died during {what} ({type(err).__name__}); rewards {self.names}") from None

    def score(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> RewardOutput:
        with self._lock:
            i = next(self._next)
        metadata = [{} for _ in prompts] if metadata is None else list(metadata)
        # RewardError raised inside the worker comes back as its own type (Ray subclasses it).
        return self._get(self.workers[i].score.remote(samples, list(prompts), metadata), "score", i)

    def describe(self, name: str) -> str:
        """`'name'`: where a remote reward went is known inside the workers only."""
        return repr(name)

    def running(self) -> list[tuple[str, float]]:
        """Always empty: what each worker's manager is scoring is not asked across Ray, so a
        timed-out step names every configured reward."""
        return []

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
