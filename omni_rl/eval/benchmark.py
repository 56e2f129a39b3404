"""`BENCHMARKS`: `--eval NAME` names a `Benchmark`, the spec of one benchmark's pinned protocol.

A benchmark declares, and nothing else decides, its model `family`, `prompts`, `protocol`,
`metrics`, `task_of`, `headline` metric and `pair_unit` (what the comparison's bootstrap resamples).

    register_benchmark(Benchmark(...))   # in a plugin module: demos/shapes/benchmark.py
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from omni_rl.eval.protocol import Protocol
from omni_rl.eval.sampling import SAMPLERS
from omni_rl.registry import Registry


@dataclass(frozen=True)
class PromptSource:
    """format: the file's rows, for docs and errors; get: where the public file is; default: a
    path (relative to the project root) used when `--eval-prompts` is not given, or None."""

    format: str
    get: str
    default: Optional[str] = None


@dataclass(frozen=True)
class Metric:
    """name: how results call it; reward: the scorer it reads; detail: a field of that scorer's
    per-sample details (None: its score); at_least: report `value >= at_least` (1 or 0) instead
    of the value; binary: the value is 0/1, so a prompt-level "any sample correct" is reported
    (GenEval's "% correct prompts")."""

    name: str
    reward: str
    detail: Optional[str] = None
    at_least: Optional[float] = None
    binary: bool = False

    def value(self, scores: dict[str, float], details: dict[str, dict]) -> float:
        raw = scores[self.reward] if self.detail is None else details[self.reward][self.detail]
        value = float(raw)
        return float(value >= self.at_least) if self.at_least is not None else value


@dataclass(frozen=True)
class Benchmark:
    name: str
    family: str
    description: str
    prompts: PromptSource
    protocol: Protocol
    metrics: tuple[Metric, ...]
    headline: str
    task_of: Optional[Callable[[dict], Optional[str]]] = None
    tasks: tuple[str, ...] = field(default_factory=tuple)
    pair_unit: str = "prompt"

    def __post_init__(self) -> None:
        if self.pair_unit not in ("prompt", "sample"):
            raise ValueError(f"benchmark {self.name!r}: pair_unit={self.pair_unit!r}, expected prompt or sample")
        if self.family not in SAMPLERS:
            raise ValueError(f"benchmark {self.name!r}: family={self.family!r}, expected a family with an evaluation "
                             f"sampler ({', '.join(SAMPLERS.names())})")
        names = [m.name for m in self.metrics]
        if self.headline not in names:
            raise ValueError(f"benchmark {self.name!r}: headline={self.headline!r} is none of its metrics {names}")
        scorers = {s.reward for s in self.protocol.scorers}
        unscored = sorted({m.reward for m in self.metrics} - scorers)
        if unscored:
            raise ValueError(f"benchmark {self.name!r}: metrics read {unscored}, which are not among its scorers")


BENCHMARKS: Registry[Benchmark] = Registry("benchmark")


def register_benchmark(benchmark: Benchmark) -> Benchmark:
    BENCHMARKS.register(benchmark.name, benchmark)
    return benchmark
