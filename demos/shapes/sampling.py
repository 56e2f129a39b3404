"""(caption, scene) pairs that match, and the train / held-out prompt splits.

- `all_specs(task)`: every caption of a task type the generator uses, in a fixed order:
  single_object (3: "a circle"), colors (12: "a red circle"), counting (45: two to four of a
  shape, with or without a colour), two_object (6: two shapes, no colours, as in GenEval),
  color_attr (72: two shapes in two different colours), position (312: two shapes, a relation,
  no colours or two different ones).
- `layout(spec, rng)`: a `Scene` satisfying the spec: exactly the objects it names (an object
  without a colour gets a random one per shape), each centred in a distinct cell of a `GRID` x
  `GRID` grid with half-extent `RADIUS`, so bounding boxes are apart by at least `GAP` and
  inside the image by `EDGE`, and for a relation the centres apart by at least
  `RELATION_OFFSET` along its axis (another column or row).
  Why a grid: a generator this small (4 blocks, 96 wide) must resolve every mode of the scene
  distribution in its first denoising steps; free positions and sizes made those modes a
  continuum, which it averaged into blobs or a blank canvas. Nine places and one size leave
  counting, binding and relations to learn, and keep shapes clear of each other.
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

from demos.shapes.grammar import RELATIONS, TASKS, ObjectSpec, SceneSpec, caption_of
from demos.shapes.scene import COLOURS, SHAPES, Scene, Shape

GRID = 3  # cells per side; a shape sits at the centre of its cell
RADIUS = 0.13  # every shape's half-extent: 8 px across at 32 px
GAP = 1 / GRID - 2 * RADIUS  # the least distance between two bounding boxes (0.073)
EDGE = 0.5 / GRID - RADIUS  # the least distance from a bounding box to the image's edge (0.037)
RELATION_OFFSET = 0.25  # the least centre offset along a relation's axis (cells are 1/3 apart)
# Names this layout in a pretraining record: models trained on other layouts say another.
LAYOUT = f"grid{GRID}-r{RADIUS}"
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


def _relation_holds(a: Shape, b: Shape, relation: str) -> bool:
    dx, dy = b.cx - a.cx, b.cy - a.cy  # y grows downwards
    offset = {"left_of": dx, "right_of": -dx, "above": dy, "below": -dy}[relation]
    return offset >= RELATION_OFFSET


def layout(spec: SceneSpec, rng: np.random.Generator) -> Scene:
    """A scene holding exactly what `spec` names (see the module docstring); deterministic in `rng`."""
    wanted: list[tuple[str, Optional[str]]] = [(o.shape, o.colour) for o in spec.objects for _ in range(o.count)]
    if len(wanted) > GRID * GRID:
        raise ValueError(f"{caption_of(spec)!r} names {len(wanted)} shapes; a {GRID}x{GRID} grid holds {GRID * GRID}")
    colours = list(COLOURS)
    for _ in range(_TRIES):
        cells = rng.permutation(GRID * GRID)[: len(wanted)]
        shapes = [
            Shape(shape, colour or colours[int(rng.integers(len(colours)))],
                  (int(cell) % GRID + 0.5) / GRID, (int(cell) // GRID + 0.5) / GRID, RADIUS)
            for (shape, colour), cell in zip(wanted, cells)
        ]
        if spec.relation is None or _relation_holds(shapes[0], shapes[1], spec.relation):
            return Scene(tuple(shapes))
    raise RuntimeError(f"no layout of {caption_of(spec)!r} found in {_TRIES} tries")


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
