"""The native diffusion rollout engine: in-process, with request-level (continuous) batching.

Each iteration packs up to `max_num_seqs` running samples sharing a batch key into one forward,
even at different steps; the `driver` is the engine's thread or the waiting caller
(docs/rollout.md). A failure fails every pending future. Not here: the per-sample maths
(`diffusion_sampling`), text (`text_native`).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Optional, Sequence

import torch

from omni_rl.models.diffusion import DiffusionModelBase
from omni_rl.rollout.base import RolloutEngine, RolloutEngineError, check_weight_kind, wait_results
from omni_rl.rollout.diffusion_sampling import (
    BatchConditioning,
    SampleState,
    advance,
    check_request,
    check_trajectory_device,
    encode_conditionings,
    finish_samples,
    start_sample,
)
from omni_rl.rollout.types import DiffusionRequest, DiffusionResult
from omni_rl.utils.tensor_buckets import NamedTensors, named_buckets


_BUCKET_BYTES = 512 << 20  # tensors handed over at once; a stream of them is consumed bucket by bucket
DRIVERS = ("thread", "caller")


class NativeDiffusionEngine(RolloutEngine):
    """Request-batched sampler around a `DiffusionModelBase` adapter."""

    def __init__(self, model: DiffusionModelBase, max_num_seqs: int = 32, max_wait_ms: float = 5.0,
                 trajectory_device: str = "device", driver: str = "thread"):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: expected >= 1")
        if driver not in DRIVERS:
            raise ValueError(f"driver={driver!r}: expected one of {list(DRIVERS)}")
        self.driver = driver
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.trajectory_device = check_trajectory_device(trajectory_device)
        self._conditioning = BatchConditioning()  # the running batch's, kept while it stays the same
        self.max_wait_s = max_wait_ms / 1000.0
        self.weight_version = 0
        self.stats = {"forwards": 0, "samples": 0, "forward_batch_sum": 0}
        self._queue: deque[tuple[DiffusionRequest, Future]] = deque()
        self._running: list[SampleState] = []
        self._futures: dict[int, Future] = {}  # id(state) -> its caller's future
        self._cv = threading.Condition()
        self._compute_lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        if driver == "thread":
            self._thread = threading.Thread(target=self._loop, name="omni-rl-rollout", daemon=True)
            self._thread.start()

    # --- public API ----------------------------------------------------------------------
    def submit(self, request: DiffusionRequest) -> Future:
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[DiffusionRequest]) -> list[Future]:
        # A malformed request is refused here, to its caller alone: admitted, it would stop the
        # engine and fail every other caller's samples with it.
        for req in requests:
            self.check_request(req)
        futures = []
        with self._cv:
            self._check_alive()
            for req in requests:
                fut: Future = Future()
                self._queue.append((req, fut))
                futures.append(fut)
            self._cv.notify_all()
        return futures

    def generate(self, requests: Sequence[DiffusionRequest], timeout_s: float = 1800.0) -> list[DiffusionResult]:
        """Submit all requests at once and wait for them (results in request order)."""
        return self.wait(requests, self.submit_many(requests), timeout_s)

    def wait(self, requests: Sequence[DiffusionRequest], futures: Sequence[Future], timeout_s: float) -> list[DiffusionResult]:
        """Results of submitted requests, in order; a failure or a timeout raises
        `RolloutEngineError` naming the request."""
        if self.driver == "caller":
            deadline = time.monotonic() + timeout_s
            self._drive(futures, deadline)
            timeout_s = max(0.0, deadline - time.monotonic())
        return wait_results(requests, futures, timeout_s)

    def check_request(self, req: DiffusionRequest) -> None:
        check_request(self.model, req)

    def failure(self) -> Optional[str]:
        if self._error is not None:
            return f"it stopped after an error: {self._error!r}"
        return "it is closed" if self._closed else None

    def shares_model_with(self, model) -> bool:
        return model is self.model  # it samples with the adapter it was built on

    def same_log_probs_as(self, model) -> bool:
        # The trainer's model itself, in fp32: the trainer's replay calls the same
        # predict_velocity and kernel on the same inputs (other precisions differ by batch shape).
        return model is self.model and self.model.dtype == torch.float32

    def update_weights(self, tensors: NamedTensors, version: int, kind: str) -> None:
        """Load named trainable tensors between two iterations, never during a forward."""
        check_weight_kind(kind)
        for bucket in named_buckets(tensors, _BUCKET_BYTES):
            with self._compute_lock:
                self.model.load_named_tensors(bucket)
        self.weight_version = version

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            if self._thread is None:
                self._fail_all(RolloutEngineError("rollout engine closed with requests pending"))
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- scheduler loop ------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._error is not None:
            raise RolloutEngineError(f"rollout engine stopped after an error: {self._error!r}")
        if self._closed:
            raise RolloutEngineError("rollout engine is closed")

    def _loop(self) -> None:
        """The scheduler thread (`driver="thread"`)."""
        while True:
            with self._cv:
                while not self._closed and not self._queue and not self._running:
                    self._cv.wait()
                if self._closed:
                    self._fail_all(RolloutEngineError("rollout engine closed with requests pending"))
                    return
                if not self._running:
                    # Idle engine: give a burst of requests max_wait to fill a batch.
                    deadline = time.monotonic() + self.max_wait_s
                    while len(self._queue) < self.max_num_seqs and not self._closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cv.wait(timeout=left)
                admitted = self._pop_admissible()
            if not self._step(admitted):
                return

    def _drive(self, futures: Sequence[Future], deadline: float) -> None:
        """Iterate in the caller's thread until `futures` are done, the deadline passes or the
        engine fails (`driver="caller"`; `wait_results` then reports which)."""
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            with self._cv:
                if self._error is not None or self._closed:
                    return
                # The caller submitted its requests before waiting, so there is no burst to wait
                # for: another thread's requests join at the next iteration.
                admitted = self._pop_admissible()
            if not admitted and not self._running:
                # Another waiting thread holds the samples this caller needs: let it iterate.
                with self._cv:
                    self._cv.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if not self._step(admitted):
                return

    def _step(self, admitted: list[tuple[DiffusionRequest, Future]]) -> bool:
        """Admit, then one iteration; False (and every pending future failed) after an error."""
        # Compute outside the queue lock, so callers can submit while a forward runs.
        try:
            with self._compute_lock:
                self._admit(admitted)
                self._iterate()
        except BaseException as err:  # noqa: BLE001 (every failure must reach the callers)
            with self._cv:
                for req, fut in admitted:
                    if not fut.done():
                        fut.set_exception(err)
                self._error = err
                self._fail_all(err)
                self._cv.notify_all()
            if self._thread is None and not isinstance(err, Exception):
                raise  # an interrupt in the caller's own thread stays an interrupt
            return False
        if self._thread is None:
            with self._cv:
                self._cv.notify_all()  # callers waiting while another caller's thread iterates
        return True

    def _pop_admissible(self) -> list[tuple[DiffusionRequest, Future]]:
        room = self.max_num_seqs - len(self._running)
        taken = []
        while self._queue and len(taken) < room:
            taken.append(self._queue.popleft())
        return taken

    def _fail_all(self, err: BaseException) -> None:
        for run in self._running:
            fut = self._futures.pop(id(run))
            if not fut.done():
                fut.set_exception(err)
        self._running.clear()
        while self._queue:
            _, fut = self._queue.popleft()
            if not fut.done():
                fut.set_exception(err)

    def _admit(self, admitted: list[tuple[DiffusionRequest, Future]]) -> None:
        if not admitted:
            return
        conditionings = encode_conditionings(self.model, [req for req, _ in admitted])
        for (req, fut), cond in zip(admitted, conditionings):
            if not fut.set_running_or_notify_cancel():
                continue
            run = start_sample(self.model, req, cond)
            self._futures[id(run)] = fut
            self._running.append(run)

    def _iterate(self) -> None:
        """One batched forward over the running samples that share the oldest one's batch key."""
        if not self._running:
            return
        batch = advance(self.model, self._running, self.max_num_seqs, self._conditioning)
        self.stats["forwards"] += 1
        self.stats["forward_batch_sum"] += len(batch)
        finished = [run for run in batch if run.done]
        if finished:
            self._finish(finished)

    def _finish(self, finished: list[SampleState]) -> None:
        for run, result in zip(finished, finish_samples(self.model, finished, self.weight_version,
                                                              self.trajectory_device)):
            self._running.remove(run)
            self.stats["samples"] += 1
            self._futures.pop(id(run)).set_result(result)
