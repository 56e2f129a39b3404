"""A benchmark's figures from its per-prompt records, and the paired bootstrap over prompts.

A metric's figures are `mean` and `se` over samples, per-task means and their unweighted
`overall` (GenEval's overall score), and for a 0/1 metric `prompts_any` (GenEval's "% correct
prompts"). `paired_bootstrap(a, b)` resamples prompts with the same draws for both results and
gives the 95% interval of B - A, holding each prompt's difficulty fixed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from omni_rl.eval.benchmark import Benchmark


@dataclass
class Table:
    """Per-prompt sums: for each metric, sums[p, t] and counts[p, t] over task t's samples of
    prompt group p (one column when the benchmark has no tasks), and any_[p] (0/1 metrics)."""

    keys: list[str]
    tasks: list[str]
    sums: dict[str, np.ndarray]
    counts: np.ndarray
    any_: dict[str, np.ndarray]
    sq: dict[str, np.ndarray]


def prompt_key(record: dict) -> str:
    return json.dumps([record["prompt"], record["metadata"]], sort_keys=True)


def _unit_keys(benchmark: Benchmark, record: dict) -> list[str]:
    """The bootstrap unit of each of the record's samples (`Benchmark.pair_unit`)."""
    key = prompt_key(record)
    if benchmark.pair_unit == "sample":
        return [f"{key}#{s['sample']}" for s in record["samples"]]
    return [key] * len(record["samples"])


def build_table(benchmark: Benchmark, records: Sequence[dict]) -> Table:
    keys = sorted({k for r in records for k in _unit_keys(benchmark, r)})
    index = {k: i for i, k in enumerate(keys)}
    tasks = list(benchmark.tasks) if benchmark.task_of else ["all"]
    for r in records:
        task = benchmark.task_of(r["metadata"]) if benchmark.task_of else "all"
        if task not in tasks:
            tasks.append(task)
    sums = {m.name: np.zeros((len(keys), len(tasks))) for m in benchmark.metrics}
    sq = {m.name: np.zeros((len(keys), len(tasks))) for m in benchmark.metrics}
    counts = np.zeros((len(keys), len(tasks)))
    any_ = {m.name: np.zeros(len(keys)) for m in benchmark.metrics if m.binary}
    for r in records:
        t = tasks.index(benchmark.task_of(r["metadata"]) if benchmark.task_of else "all")
        for sample, unit in zip(r["samples"], _unit_keys(benchmark, r)):
            p = index[unit]
            counts[p, t] += 1
            for m in benchmark.metrics:
                v = sample["metrics"][m.name]
                sums[m.name][p, t] += v
                sq[m.name][p, t] += v * v
                if m.binary and v >= 0.5:
                    any_[m.name][p] = 1.0
    return Table(keys, tasks, sums, counts, any_, sq)


def _figures_weighted(benchmark: Benchmark, table: Table, w: np.ndarray) -> dict[str, np.ndarray]:
    """Every figure for prompt weights w [D, P] (D draws): name -> [D] values."""
    out: dict[str, np.ndarray] = {}
    counts = w @ table.counts  # [D, T]
    with np.errstate(invalid="ignore", divide="ignore"):
        for m in benchmark.metrics:
            sums = w @ table.sums[m.name]
            out[f"{m.name}/mean"] = sums.sum(1) / counts.sum(1)
            if benchmark.task_of:
                per_task = sums / counts
                for t, task in enumerate(table.tasks):
                    out[f"{m.name}/tasks/{task}"] = per_task[:, t]
                present = table.counts.sum(0) > 0
                out[f"{m.name}/overall"] = np.nanmean(per_task[:, present], axis=1)
            else:
                out[f"{m.name}/overall"] = out[f"{m.name}/mean"]
            if m.binary and benchmark.pair_unit == "prompt":
                out[f"{m.name}/prompts_any"] = (w @ table.any_[m.name]) / w.sum(1)
    return out


def figures(benchmark: Benchmark, records: Sequence[dict]) -> dict[str, dict]:
    """Each metric's figures (module docstring), as results.json holds them."""
    table = build_table(benchmark, records)
    flat = {k: float(v[0]) for k, v in _figures_weighted(benchmark, table, np.ones((1, len(table.keys)))).items()}
    n = float(table.counts.sum())
    out: dict[str, dict] = {}
    for m in benchmark.metrics:
        mean = flat[f"{m.name}/mean"]
        var = max(table.sq[m.name].sum() / n - mean * mean, 0.0) * n / max(n - 1, 1)
        fig: dict = {"overall": flat[f"{m.name}/overall"], "mean": mean, "se": math.sqrt(var / n), "samples": int(n)}
        if benchmark.task_of:
            counts = table.counts.sum(0)
            fig["tasks"] = {task: {"mean": flat[f"{m.name}/tasks/{task}"], "samples": int(counts[t])}
                            for t, task in enumerate(table.tasks) if counts[t] > 0}
        if f"{m.name}/prompts_any" in flat:
            fig["prompts_any"] = flat[f"{m.name}/prompts_any"]
        out[m.name] = fig
    return out


def paired_bootstrap(benchmark: Benchmark, a: Sequence[dict], b: Sequence[dict], draws: int = 2000,
                     seed: int = 0) -> dict[str, dict[str, float]]:
    """name -> {"a", "b", "delta", "low", "high", "units"} for every figure (95% percentile
    interval of B - A over `draws` resamples of the units both results hold). A figure resting
    on fewer than 2 units (a task with one prompt) has no interval: low and high are NaN, since
    resampling one unit cannot show how much it varies."""
    ta, tb = build_table(benchmark, a), build_table(benchmark, b)
    if ta.keys != tb.keys:
        only = sorted(set(ta.keys) ^ set(tb.keys))
        raise ValueError(f"the two results hold different prompts ({len(only)} not in both, e.g. {only[0][:120]})")
    tb = _align_tasks(tb, ta.tasks)
    rng = np.random.default_rng(seed)
    n = len(ta.keys)
    w = np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1.0 / n), size=draws)]).astype(np.float64)
    fa, fb = _figures_weighted(benchmark, ta, w), _figures_weighted(benchmark, tb, w)
    units_per_task = (ta.counts > 0).sum(axis=0)
    out = {}
    for key in fa:
        task = key.split("/tasks/", 1)[1] if "/tasks/" in key else None
        units = int(units_per_task[ta.tasks.index(task)]) if task is not None else n
        delta = fb[key][1:] - fa[key][1:]
        ok = delta[np.isfinite(delta)]
        low, high = (np.percentile(ok, [2.5, 97.5]) if len(ok) and units >= 2 else (math.nan, math.nan))
        out[key] = {"a": float(fa[key][0]), "b": float(fb[key][0]), "delta": float(fb[key][0] - fa[key][0]),
                    "low": float(low), "high": float(high), "units": units}
    return out


def _align_tasks(table: Table, tasks: list[str]) -> Table:
    """`table` with its task columns in the order of `tasks` (a task it lacks: zero columns)."""
    if table.tasks == tasks:
        return table
    extra = [t for t in table.tasks if t not in tasks]
    if extra:
        raise ValueError(f"the second result has tasks the first lacks: {extra}")
    cols = [table.tasks.index(t) if t in table.tasks else None for t in tasks]

    def take(x: np.ndarray) -> np.ndarray:
        return np.stack([x[:, c] if c is not None else np.zeros(x.shape[0]) for c in cols], axis=1)

    return Table(table.keys, tasks, {k: take(v) for k, v in table.sums.items()}, take(table.counts), table.any_,
                 {k: take(v) for k, v in table.sq.items()})

