"""`WorkerGroup`: start N hybrid workers on a resource pool, run programs on them, gather back.

`run(what, fn, args_per_rank)` calls `fn(worker, *args)` on every rank and returns results in
rank order; `submit` and `as_completed` stream calls. Every wait has a deadline, and a dead worker
becomes `WorkerFailedError` naming its rank, node, pid, program and step once the group is torn
down, so nothing hangs.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from omni_rl.workers.errors import WorkerFailedError
from omni_rl.workers.hybrid_worker import FAULT_ENV, HybridWorker
from omni_rl.workers.resource_pool import ResourcePool

log = logging.getLogger(__name__)

# Passed on to the workers' environment (a cluster's workers do not inherit the driver's).
FORWARDED_ENV = ("OMNI_RL_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS", FAULT_ENV)


class WorkerGroup:
    def __init__(self, pool: ResourcePool, device_name: str, timeout_s: float, num_threads: int = 1,
                 startup_timeout_s: float = 300.0):
        import ray

        self.pool = pool
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.world_size = pool.world_size
        self.step = 0
        self.closed = False
        self.workers: list[Any] = []  # none yet: a failed start's shutdown kills what was made
        self.infos: list[dict[str, Any]] = [{"rank": r, "node": "?", "pid": "?"} for r in range(self.world_size)]
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        pool.reserve(startup_timeout_s)
        remote_cls = ray.remote(max_restarts=0, max_task_retries=0)(HybridWorker)
        self.workers = [
            remote_cls.options(
                scheduling_strategy=pool.scheduling(r), runtime_env={"env_vars": env} if env else None,
                name=None, **pool.actor_options(),
            ).remote(r, self.world_size, device_name, num_threads)
            for r in range(self.world_size)
        ]
        up = time.monotonic() + startup_timeout_s
        self.infos = self._gather([w.node_info.remote() for w in self.workers], "start", deadline=up)
        addr, port = self._gather([self.workers[0].master_address.remote()], "start", deadline=up)[0]
        self._gather(
            [w.init_process_group.remote(addr, port, timeout_s, startup_timeout_s) for w in self.workers],
            "init_process_group",
            deadline=up,
        )
        log.info("worker group up: %s (process group at %s:%d)", self.describe(), addr, port)

    def describe(self) -> str:
        return ", ".join(f"rank {i['rank']} on {i['node']} pid {i['pid']}" for i in self.infos)

    def run(self, what: str, fn: Callable[..., Any], args_per_rank: Sequence[tuple] | None = None,
            step: int | None = None) -> list[Any]:
        """`fn(worker, *args_per_rank[r])` on every rank r (no arguments when None); results by rank."""
        if self.closed:
            raise WorkerFailedError(f"the worker group was shut down after an earlier failure; cannot run {what}")
        args = args_per_rank or [()] * self.world_size
        if len(args) != self.world_size:
            raise ValueError(f"{what}: {len(args)} argument sets for {self.world_size} workers; expected one per rank")
        s = self.step if step is None else step
        refs = [w.call.remote(s, fn, *a) for w, a in zip(self.workers, args)]
        return self._gather(refs, what, s)

    def submit(self, what: str, fn: Callable[..., Any], calls: Sequence[tuple[int, tuple]]) -> list:
        """Queue `fn(worker, *args)` for each `(rank, args)` in `calls` without waiting; a rank
        runs its calls one after another in this order. Returns one Ray reference per call, for
        `as_completed`."""
        if self.closed:
            raise WorkerFailedError(f"the worker group was shut down after an earlier failure; cannot run {what}")
        bad = [rank for rank, _ in calls if not 0 <= rank < self.world_size]
        if bad:
            raise ValueError(f"{what}: ranks {bad} do not exist; expected 0..{self.world_size - 1}")
        return [self.workers[rank].call.remote(self.step, fn, *args) for rank, args in calls]

    def _gather(self, refs: list, what: str, step: int | None = None, deadline: float | None = None) -> list[Any]:
        results = dict(self.as_completed(refs, what, step, deadline=deadline))
        return [results[r] for r in range(len(refs))]

    def as_completed(self, refs: list, what: str, step: int | None = None,
                     ranks: Sequence[int] | None = None, deadline: float | None = None) -> Iterator[tuple[int, Any]]:
        """(index in `refs`, result) for each call as it finishes, all within `timeout_s` of the
        start (or by the monotonic `deadline` when given: start-up's); a dead or silent worker, or
        an exception in a call, ends the group (see above). `ranks[i]` is the rank `refs[i]` runs
        on (default: i), for naming a failed worker."""
        import ray
        from ray.exceptions import (
            ActorDiedError,
            ActorUnavailableError,
            RayActorError,
            RayTaskError,
        )

        step = self.step if step is None else step
        index = {ref: i for i, ref in enumerate(refs)}
        ranks = {ref: r for ref, r in zip(refs, range(len(refs)) if ranks is None else ranks)}
        pending = list(refs)
        limit = (
            f"trainer.backend_options.worker_startup_timeout_s={self.startup_timeout_s:g} s" if deadline is not None
            else f"trainer.backend_options.worker_timeout_s={self.timeout_s:g} s"
        )
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, left))
            if not ready:
                rank = ranks[pending[0]]
                self.shutdown()
                raise WorkerFailedError(
                    f"worker {self._name(rank)} did not finish {what} at step {step} within "
                    f"{limit}; the run stopped (raise the timeout if the step is just slow)", rank=rank, step=step,
                )
            ref = ready[0]
            rank = ranks[ref]
            try:
                result = ray.get(ref)
            except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
                self.shutdown()
                raise WorkerFailedError(
                    f"worker {self._name(rank)} died during {what} at step {step} "
                    f"({type(err).__name__}); see its log under the Ray session folder (logs/worker-*)",
                    rank=rank, step=step,
                ) from None
            except RayTaskError as err:
                self.shutdown()
                cause = err.as_instanceof_cause()
                log.error("worker %s failed during %s at step %s: %s", self._name(rank), what, step, err)
                raise cause from None
            yield index[ref], result

    def _name(self, rank: int) -> str:
        i = self.infos[rank] if rank < len(self.infos) else {"node": "?", "pid": "?"}
        return f"rank {rank} (node {i['node']}, pid {i['pid']})"

    def shutdown(self) -> None:
        """Kill every worker and release the pool (idempotent)."""
        if self.closed:
            return
        import ray

        self.closed = True
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001  (already dead)
                pass
        self.pool.release()
