"""Reward curves from a run's metrics.jsonl, and the test of whether a run learned.

`plot_reward_curve(jsonl_path, out_png)` draws the rewards with matplotlib's Agg canvas (never
pyplot); `rise_report(jsonl_path, key)` compares the first and last `frac` of the values in
standard errors (z > 3: it rose). docs/getting-started.md (Did it learn?) has the formula.
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from omni_rl.logging.sinks import read_jsonl
from omni_rl.utils.atomic import atomic_write_bytes

RISE_Z_THRESHOLD = 3.0
MIN_RISE_STEPS = 5


def metric_series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key`, sorted by step, nulls skipped, the last value per step kept."""
    by_step: dict[int, float] = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            by_step[int(record["step"])] = float(value)
    steps = np.array(sorted(by_step), dtype=np.int64)
    values = np.array([by_step[int(step)] for step in steps], dtype=np.float64)
    return steps, values


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values; the first few average what exists so far."""
    if window < 1:
        raise ValueError(f"moving-average window must be >= 1 steps, got {window}")
    cumulative = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (cumulative[ends] - cumulative[starts]) / (ends - starts)


def plot_reward_curve(
    jsonl_path: str | os.PathLike,
    out_png: str | os.PathLike,
    keys: Sequence[str] = ("reward/total/mean",),
    val_key: str | None = "val/reward/total/mean",
    window: int | None = None,
    title: str | None = None,
) -> Path:
    """Plot `keys` per step with a moving average of `window` steps, plus `val_key` points; write `out_png`.

    Raises if none of `keys` has a value in the file.
    """
    # Imported here so that `import omni_rl.logging` stays cheap for the trainer.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    jsonl_path = Path(jsonl_path)
    if isinstance(keys, str):
        keys = (keys,)
    records = read_jsonl(jsonl_path)
    series = {key: metric_series(records, key) for key in keys}
    if not any(len(steps) for steps, _ in series.values()):
        raise ValueError(
            f"{jsonl_path} has no values for {list(keys)}; metrics found there: "
            f"{sorted({name for record in records for name in record} - {'step'}) or '(none)'}"
        )

    figure = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (key, (steps, values)) in enumerate(series.items()):
        if not len(steps):
            continue
        color = f"C{index}"
        span = window or max(1, len(values) // 10)
        axes.plot(steps, values, color=color, alpha=0.3, linewidth=1)
        axes.plot(steps, moving_average(values, span), color=color, linewidth=2,
                  label=f"{key} (moving avg, {span} steps)")
    if val_key is not None:
        val_steps, val_values = metric_series(records, val_key)
        if len(val_steps):
            axes.plot(val_steps, val_values, color="black", marker="o", linestyle="--",
                      linewidth=1, label=val_key)
    axes.set_xlabel("training step")
    axes.set_ylabel("reward")
    axes.set_title(title or f"reward curve: {jsonl_path.resolve().parent.name}")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return atomic_write_bytes(out_png, buffer.getvalue())


def rise_report(
    jsonl_path: str | os.PathLike,
    key: str = "reward/total/mean",
    frac: float = 0.2,
) -> dict[str, Any]:
    """Compare the first and last `frac` of the logged steps of `key` (docs/getting-started.md).

    Returns `key`, `n_steps`, `window`, `first_mean`, `first_se`, `last_mean`, `last_se`, `z` and
    `rose` (z > 3); with both windows constant, z is +-inf for a change and 0 for none.
    """
    if not 0 < frac <= 0.5:
        raise ValueError(f"frac must be in (0, 0.5] so the first and last windows do not overlap, got {frac}")
    jsonl_path = Path(jsonl_path)
    _, values = metric_series(read_jsonl(jsonl_path), key)
    if len(values) < MIN_RISE_STEPS:
        raise ValueError(
            f"{jsonl_path} has {len(values)} logged steps with {key!r}; rise_report needs at least "
            f"{MIN_RISE_STEPS} (two per window for a standard error); train longer or log more often"
        )
    n = len(values)
    # Two values at least (ddof=1 needs them); the epsilon keeps 0.2 * 15 from flooring to 2.
    k = max(2, int(frac * n + 1e-9))
    first, last = values[:k], values[-k:]
    first_mean, last_mean = float(first.mean()), float(last.mean())
    first_se = float(first.std(ddof=1) / math.sqrt(k))
    last_se = float(last.std(ddof=1) / math.sqrt(k))
    diff = last_mean - first_mean
    noise = math.sqrt(first_se**2 + last_se**2)
    if noise > 0:
        z = diff / noise
    else:
        z = math.copysign(math.inf, diff) if diff else 0.0
    return {
        "key": key,
        "n_steps": n,
        "window": k,
        "first_mean": first_mean,
        "first_se": first_se,
        "last_mean": last_mean,
        "last_se": last_se,
        "z": z,
        "rose": bool(z > RISE_Z_THRESHOLD),
    }
