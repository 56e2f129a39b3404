"""A grid of samples per task of a finished evaluation: `grids/<task>.png` (`grids/all.png` without tasks).

Samples with a picture only (an image, or a video's first frame, its `poster`); a benchmark of
texts or speech has no grid. Up to `per_task` samples of each task in row order, captioned with the prompt and the headline
metric's value; where the headline metric is 0/1 (a verdict) each tile is framed green (pass) or
red (fail), as the validation grids are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omni_rl.eval.benchmark import Benchmark


def write_grids(out: Path, benchmark: Benchmark, records: Sequence[dict], per_task: int = 24) -> list[Path]:
    from PIL import Image

    from omni_rl.logging import make_grid
    from omni_rl.utils.atomic import atomic_save_image

    headline = next(m for m in benchmark.metrics if m.name == benchmark.headline)
    by_task: dict[str, list[tuple[dict, dict]]] = {}
    for record in records:
        task = (benchmark.task_of(record["metadata"]) if benchmark.task_of else None) or "all"
        shown = by_task.setdefault(task, [])
        for sample in record["samples"]:
            if len(shown) < per_task and _picture(sample) is not None:
                shown.append((record, sample))
    written = []
    for task, shown in by_task.items():
        if not shown:
            continue
        images = [Image.open(out / _picture(s)).convert("RGB") for _, s in shown]
        values = [s["metrics"][headline.name] for _, s in shown]
        captions = [f"{r['prompt'][:40]} | {v:.3g}" for (r, _), v in zip(shown, values)]
        marks = [v >= 0.5 for v in values] if headline.binary else None
        grid = make_grid(images, nrow=min(8, len(images)), captions=captions, marks=marks)
        written.append(atomic_save_image(grid, out / "grids" / f"{task}.png"))
    return written


def _picture(sample: dict) -> str | None:
    """The sample's image file (relative to the evaluation folder), or None."""
    file = sample.get("poster") or sample.get("file")
    return file if file and file.endswith(".png") else None
