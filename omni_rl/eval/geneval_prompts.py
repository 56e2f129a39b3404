"""GenEval-style training prompts with their metadata rows, from GenEval's generation rules.

`generate_rows(n, seed, weights, exclude_prompts)` draws a task, then its rule over
`COCO_CLASSES`, `COLOURS` and `RELATIONS` (docs/evaluation.md, Getting the data); one seed gives
one list.

    python -m omni_rl.eval.geneval_prompts --n 50000 --seed 1 --out train.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from omni_rl.eval.geneval_rules import COCO_CLASSES, COLOURS, GENEVAL_TASKS, RELATIONS

_NUMBERS = {2: "two", 3: "three", 4: "four"}
_COLOURABLE = tuple(c for c in COCO_CLASSES if c != "person")  # GenEval writes no "[colour] person" prompt
_MAX_DRAWS_PER_ROW = 1000


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _plural(word: str) -> str:
    return f"{word}es" if word.endswith("s") else f"{word}s"


def _pick(rng: np.random.Generator, items: tuple[str, ...], k: int = 1) -> list[str]:
    return [items[int(i)] for i in rng.choice(len(items), size=k, replace=False)]


def draw_row(task: str, rng: np.random.Generator) -> dict[str, Any]:
    """One row of `task` by its rule (tabled in docs/evaluation.md)."""
    if task == "single_object":
        [name] = _pick(rng, COCO_CLASSES)
        return {"tag": task, "include": [{"class": name, "count": 1}], "prompt": f"a photo of {_a(name)}"}
    if task == "two_object":
        a, b = _pick(rng, COCO_CLASSES, 2)
        return {"tag": task, "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
                "prompt": f"a photo of {_a(a)} and {_a(b)}"}
    if task == "counting":
        [name] = _pick(rng, COCO_CLASSES)
        n = int(rng.integers(2, 4, endpoint=True))
        return {"tag": task, "include": [{"class": name, "count": n}], "exclude": [{"class": name, "count": n + 1}],
                "prompt": f"a photo of {_NUMBERS[n]} {_plural(name)}"}
    if task == "colors":
        [name], [colour] = _pick(rng, _COLOURABLE), _pick(rng, COLOURS)
        return {"tag": task, "include": [{"class": name, "count": 1, "color": colour}],
                "prompt": f"a photo of {_a(colour)} {name}"}
    if task == "position":
        (a, b), [relation] = _pick(rng, COCO_CLASSES, 2), _pick(rng, RELATIONS)
        return {"tag": task, "include": [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [relation, 0]}],
                "prompt": f"a photo of {_a(a)} {relation} {_a(b)}"}
    if task == "color_attr":
        (a, b), (ca, cb) = _pick(rng, _COLOURABLE, 2), _pick(rng, COLOURS, 2)
        return {"tag": task, "include": [{"class": a, "count": 1, "color": ca}, {"class": b, "count": 1, "color": cb}],
                "prompt": f"a photo of {_a(ca)} {a} and {_a(cb)} {b}"}
    raise ValueError(f"task={task!r}; expected one of {', '.join(GENEVAL_TASKS)}")


def distinct_prompts(task: str) -> int:
    """How many different prompts `task`'s rule can write."""
    k, c, m = len(COCO_CLASSES), len(COLOURS), len(_COLOURABLE)
    return {"single_object": k, "two_object": k * (k - 1), "counting": 3 * k, "colors": m * c,
            "position": k * (k - 1) * len(RELATIONS), "color_attr": m * (m - 1) * c * (c - 1)}[task]


def _task_weights(weights: Optional[Mapping[str, float]]) -> np.ndarray:
    if weights is None:
        return np.full(len(GENEVAL_TASKS), 1.0 / len(GENEVAL_TASKS))
    unknown = sorted(set(weights) - set(GENEVAL_TASKS))
    if unknown:
        raise ValueError(f"weights name tasks {unknown}; expected tasks among {', '.join(GENEVAL_TASKS)}")
    values = np.array([float(weights.get(t, 0.0)) for t in GENEVAL_TASKS])
    if not all(math.isfinite(v) and v >= 0 for v in values) or values.sum() <= 0:
        raise ValueError(f"weights={dict(weights)!r}; expected non-negative numbers, at least one above 0")
    return values / values.sum()


def generate_rows(n: int, seed: int = 0, weights: Optional[Mapping[str, float]] = None,
                  exclude_prompts: Iterable[str] = (), unique: bool = False) -> list[dict[str, Any]]:
    """`n` GenEval rows (module docstring), none of whose prompts is in `exclude_prompts`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}; expected a positive number of rows")
    p = _task_weights(weights)
    excluded = set(exclude_prompts)
    if unique:
        room = sum(distinct_prompts(t) for t, w in zip(GENEVAL_TASKS, p) if w > 0)
        if n > room:
            raise ValueError(f"n={n} unique prompts asked, but the tasks weighted above 0 write at most {room}; "
                             f"lower n, weight more tasks or set unique=False")
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    made: set[str] = set()
    for _ in range(n):
        task = GENEVAL_TASKS[int(rng.choice(len(GENEVAL_TASKS), p=p))]
        for _draw in range(_MAX_DRAWS_PER_ROW):  # redrawn within its task, so the weights hold
            row = draw_row(task, rng)
            if row["prompt"] not in excluded and not (unique and row["prompt"] in made):
                break
        else:
            raise ValueError(f"no new {task} prompt in {_MAX_DRAWS_PER_ROW} draws after {len(rows)} rows: its "
                             f"{distinct_prompts(task)} prompts are (nearly) all in exclude_prompts"
                             f"{' or made already (unique)' if unique else ''}; give {task} weight 0 or ask fewer rows")
        made.add(row["prompt"])
        rows.append(row)
    return rows


def read_prompts(path: str | Path) -> set[str]:
    """The prompts of a metadata jsonl file (one row with a "prompt" per line)."""
    prompts = set()
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path} line {i + 1}: expected a JSON object with a 'prompt' string, got {line[:80]!r}")
            prompts.add(row["prompt"])
    return prompts


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Write GenEval-style training rows (jsonl).")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", action="append", default=[], help="a metadata jsonl whose prompts to leave out")
    parser.add_argument("--unique", action="store_true")
    parser.add_argument("--no-single-object", action="store_true", help="weight single_object 0 (its 80 prompts are all test prompts)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    excluded = set().union(*(read_prompts(p) for p in args.exclude)) if args.exclude else set()
    weights = {t: float(not (args.no_single_object and t == "single_object")) for t in GENEVAL_TASKS}
    rows = generate_rows(args.n, args.seed, weights, exclude_prompts=excluded, unique=args.unique)
    Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
