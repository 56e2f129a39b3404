"""`StepTimer`: wall-clock seconds of a step's phases, as `timing/*` metrics.

    timer = StepTimer()
    with timer("rollout"):
        ...
    timer.metrics(num_samples)  # {"timing/rollout": s, ..., "timing/step": s, "perf/samples_per_s": n / s}
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepTimer:
    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing/{phase}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0

    def metrics(self, num_samples: int) -> dict[str, float]:
        step = time.perf_counter() - self._start
        return {**self.seconds, "timing/step": step, "perf/samples_per_s": num_samples / step}
