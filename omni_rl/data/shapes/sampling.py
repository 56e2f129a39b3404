"""(caption, scene) pairs that match, and the train / held-out prompt splits.

- `all_specs(task)`: every caption of a task type the generator uses, in a fixed order:
  single_object (3: "a circle"), colors (12: "a red circle"), counting (45: two to four of a
  shape, with or without a colour), two_object (6: two shapes, no colours, as in GenEval),
  color_attr (72: two shapes in two different colours), position (312: two shapes, a relation,
  no colours or two different ones).
- `layout(spec, rng)`: a `Scene` satisfying the spec: exactly the objects it names (an object
  without a colour gets a random one per shape), half-extents in [0.11, 0.17] of the side (0.14
  at most with three or four shapes), bounding boxes apart by at least `GAP` and inside the
  image, and for a relation the centres apart by at least `RELATION_OFFSET` along its axis.
- `sample_pair(seed, task=None)`: a task type (uniform when None), a caption of it (uniform),
  its layout; the same seed gives the same pair (numpy's PCG64 from `seed`).
- `prompt_splits(seed)`: each task's captions shuffled with `seed`, capped at `cap`, of which
  `heldout_fraction` (at least one) are held out: two lists of specs with no caption in common.

Every draw comes from the `numpy.random.Generator` passed in, so a pretraining script or a
dataset that seeds it per index gets the same scene for the same index.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from omni_rl.data.shapes.grammar import RELATIONS, TASKS, ObjectSpec, SceneSpec, caption_of
from omni_rl.data.shapes.scene import COLOURS, SHAPES, Scene, Shape

GAP = 0.06  # the least distance between two bounding boxes, in units of the side
EDGE = 0.02  # the least distance from a bounding box to the image's edge
RELATION_OFFSET = 0.25  # the least centre offset along a relation's axis
_R_RANGE = (0.11, 0.17)  # below ~0.1 a circle at 32 px is a handful of pixels
_R_MAX_CROWDED = 0.14  # with three or four shapes
_TRIES = 2000


@dataclass(frozen=True)
class ScenePair:
    caption: str
    spec: SceneSpec
    scene: Scene


def all_specs(task: str) -> list[SceneSpec]:
    """Every spec of `task` the generator draws from, in a fixed order."""
    colours = list(COLOURS)
    shape_pairs = list(itertools.permutations(SHAPES, 2))
    colour_pairs = list(itertools.permutations(colours, 2))
    if task == "single_object":
        return [SceneSpec((ObjectSpec(s),)) for s in SHAPES]
    if task == "colors":
        return [SceneSpec((ObjectSpec(s, 1, c),)) for s in SHAPES for c in colours]
    if task == "counting":
        return [SceneSpec((ObjectSpec(s, n, c),)) for n in (2, 3, 4) for s in SHAPES for c in [None] + colours]
    if task == "two_object":
        return [SceneSpec((ObjectSpec(a), ObjectSpec(b))) for a, b in shape_pairs]
    if task == "color_attr":
        return [SceneSpec((ObjectSpec(a, 1, ca), ObjectSpec(b, 1, cb))) for a, b in shape_pairs for ca, cb in colour_pairs]
    if task == "position":
        return [
            SceneSpec((ObjectSpec(a, 1, ca), ObjectSpec(b, 1, cb)), relation)
            for relation in RELATIONS for a, b in shape_pairs for ca, cb in [(None, None)] + colour_pairs
        ]
    raise ValueError(f"task={task!r}; expected one of {', '.join(TASKS)}")


def _boxes_apart(a: Shape, b: Shape) -> bool:
    """Whether the bounding boxes of a and b are at least GAP apart along x or along y."""
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    return max(bx0 - ax1, ax0 - bx1) >= GAP or max(by0 - ay1, ay0 - by1) >= GAP


def _relation_holds(a: Shape, b: Shape, relation: str) -> bool:
    dx, dy = b.cx - a.cx, b.cy - a.cy  # y grows downwards
    offset = {"left_of": dx, "right_of": -dx, "above": dy, "below": -dy}[relation]
    return offset >= RELATION_OFFSET


def layout(spec: SceneSpec, rng: np.random.Generator) -> Scene:
    """A scene holding exactly what `spec` names (see the module docstring); deterministic in `rng`."""
    wanted: list[tuple[str, Optional[str]]] = [(o.shape, o.colour) for o in spec.objects for _ in range(o.count)]
    r_max = _R_RANGE[1] if len(wanted) <= 2 else _R_MAX_CROWDED
    colours = list(COLOURS)
    for _ in range(_TRIES):
        shapes: list[Shape] = []
        for shape, colour in wanted:
            r = float(rng.uniform(_R_RANGE[0], r_max))
            cx, cy = rng.uniform(EDGE + r, 1 - EDGE - r, size=2)
            shapes.append(Shape(shape, colour or colours[int(rng.integers(len(colours)))], float(cx), float(cy), r))
        apart = all(_boxes_apart(a, b) for a, b in itertools.combinations(shapes, 2))
        if apart and (spec.relation is None or _relation_holds(shapes[0], shapes[1], spec.relation)):
            return Scene(tuple(shapes))
    raise RuntimeError(f"no layout of {caption_of(spec)!r} found in {_TRIES} tries; widen GAP / the size range")


def sample_pair(seed: int, task: Optional[str] = None) -> ScenePair:
    """A matching (caption, spec, scene), deterministic in (seed, task)."""
    rng = np.random.default_rng(seed)
    if task is None:
        task = TASKS[int(rng.integers(len(TASKS)))]
    specs = all_specs(task)
    spec = specs[int(rng.integers(len(specs)))]
    return ScenePair(caption_of(spec), spec, layout(spec, rng))


def prompt_splits(seed: int = 0, cap: int = 80, heldout_fraction: float = 0.2) -> tuple[list[SceneSpec], list[SceneSpec]]:
    """(train, held-out) specs: per task, its captions shuffled with `seed`, the first `cap`
    kept, round(heldout_fraction * kept) of them (at least one) held out. Disjoint by caption."""
    if not 0 < heldout_fraction < 1 or cap < 2:
        raise ValueError(f"heldout_fraction={heldout_fraction!r}, cap={cap!r}; expected 0 < fraction < 1 and cap >= 2")
    rng = np.random.default_rng(seed)
    train: list[SceneSpec] = []
    heldout: list[SceneSpec] = []
    for task in TASKS:
        specs = all_specs(task)
        kept = [specs[i] for i in rng.permutation(len(specs))[:cap]]
        n_out = max(1, round(heldout_fraction * len(kept)))
        heldout += kept[:n_out]
        train += kept[n_out:]
    return train, heldout
