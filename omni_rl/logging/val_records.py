"""Per-sample validation records, and the paired test of whether validation accuracy rose.

Each validation writes `OUTPUT/samples/val_step_NNNNNN.jsonl`, a row per sample. Samples are
deterministic, so `val_rise(output_dir)` pairs the first and last files by (prompt, seed):
z = mean(d) / (std(d, ddof=1) / sqrt(n)) with d_i = last_i - first_i.
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from omni_rl.utils.atomic import atomic_write_text

_PATTERN = "val_step_*.jsonl"


def write_val_records(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """Write the rows (one JSON object a line) atomically to `path`."""
    return atomic_write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


def read_val_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def val_record_files(output_dir: str | os.PathLike) -> list[Path]:
    """The run's validation record files, in step order."""
    return sorted((Path(output_dir) / "samples").glob(_PATTERN))


def val_rise(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Paired comparison of the run's first and last validation (see the module docstring)."""
    files = val_record_files(output_dir)
    if len(files) < 2:
        raise ValueError(
            f"{Path(output_dir) / 'samples'} has {len(files)} validation record file(s) ({_PATTERN}); "
            f"val_rise needs two: run with trainer.val_every > 0 for at least val_every steps"
        )
    first, last = (_by_key(read_val_records(f)) for f in (files[0], files[-1]))
    keys = sorted(set(first) & set(last))
    if len(keys) < 2:
        raise ValueError(
            f"{files[0].name} and {files[-1].name} share {len(keys)} (prompt, seed) pair(s); val_rise "
            f"needs two or more: keep the validation prompts and trainer.val_seed fixed over the run"
        )
    before = np.array([first[k]["reward"] for k in keys], dtype=np.float64)
    after = np.array([last[k]["reward"] for k in keys], dtype=np.float64)
    diff = after - before
    se = float(diff.std(ddof=1) / math.sqrt(len(diff)))
    rise = float(diff.mean())
    z = rise / se if se > 0 else (math.copysign(math.inf, rise) if rise else 0.0)
    return {
        "first_file": files[0].name, "last_file": files[-1].name, "n": len(keys),
        "first_mean": float(before.mean()), "last_mean": float(after.mean()),
        "rise": rise, "se": se, "z": z, "groups": _group_means(keys, first, last),
    }


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(row["prompt"], int(row["seed"])): row for row in rows}


def _group_means(keys, first, last) -> dict[str, dict[str, float]]:
    """Each group's mean raw score (of the reward that named the group), first and last."""
    pairs: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for key in keys:
        for name, group in first[key].get("groups", {}).items():
            if group is not None and name in last[key].get("scores", {}):
                pairs[group][0].append(first[key]["scores"][name])
                pairs[group][1].append(last[key]["scores"][name])
    return {
        group: {"first_mean": float(np.mean(b)), "last_mean": float(np.mean(a)), "n": len(b)}
        for group, (b, a) in sorted(pairs.items())
    }
