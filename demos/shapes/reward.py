"""`geneval_shapes`: GenEval's checks on flat-shape scenes, with a detector that has no weights.

The images are those of `demos.shapes.scene` (circles, squares and triangles in red, green,
blue and yellow on a plain background) or a generator's attempt at them; the prompts are
captions of its grammar (`demos.shapes.grammar`). What to check is read from the
sample's `metadata["geneval"]` (a `SceneSpec` or its `to_dict()`) when given, else parsed from
the prompt; a prompt outside the grammar fails the batch with an error naming it, and every
prompt is checked before any model loads (`check_spec_item`, the registry's `check_item`).

Detection (`detect`), for uint8 RGB [H, W, 3]:
1. the background colour is the per-channel median of the border pixels;
2. each pixel takes the nearest of the palette colours and the background (RGB distance); a
   palette pixel nearer than `colour_threshold` to it counts, every other pixel is ignored;
3. each colour's pixels form 4-connected components; those under `min_area` (a fraction of
   the image) are noise;
4. a component's shape is the one that, drawn as the renderer draws it, overlaps it best: a
   circle, a square and an upright triangle of the component's area, placed at its centroid
   (a triangle's centroid lies 2/3 of the way down from its apex), each compared with the
   component by IoU; the best one counts if its IoU is at least 0.75, else the component is a
   blob of no shape (a 3:1 bar fits a square at 0.52, an L a triangle at 0.70). Fitting by area and
   centroid rather than by bounding box keeps 7-pixel circles apart from squares at 32 px and
   forgives a blurred generator's edges. Its position is its centroid, in units of the side.

Scoring (`checks`): per object of the caption, with `objs` its shape's detections and `matched`
those of its colour (all of them when the caption names none):
- counting ("three green triangles"): count = max(0, 1 - |len(objs) - n| / n) (GenEval counts
  exactly), and with a colour, colour = 1 if objs and every one of them has it;
- otherwise: present = 1 if objs, and with a colour or a count n > 1, enough = 1 if
  len(matched) >= n (so the colour binds to its shape: "a red circle and a blue triangle"
  fails on a blue circle and a red triangle);
- a relation ("A to the left of B") = 1 if some matched A and matched B have centroids apart
  by more than `position_margin` along its axis in its direction (y grows downwards).
The reward is 1 when every check is 1, else 0; `partial_credit=True` gives the mean of the
checks instead (hand-checked values in the tests).

GenEval's own rules on these detections (`demos.shapes.geneval`: each shape a class, score 1.0,
its pixel box and detected colour; `shape_verdict(image, spec)`) agree with `checks` on what a
right scene is for counting, single objects and two objects, and differ where flat shapes need
their own rules, which stay the training reward:
- colour: GenEval reads the colour of the first `count` objects of a class in score order. This
  detector has no scores (all 1.0), so "first" would be the palette order of its search, and "a
  red circle" beside a blue circle would pass or fail by that order; `checks` asks that `count`
  of the shape have the colour, whichever they are.
- position: GenEval compares box centres with a margin of 0.1 of the two boxes' dimensions and
  asks the relation's axis to dominate the direction (|revised offset| / |offset| > 0.5), for
  every pair of the objects read; `checks` asks for some matched pair whose centroids are apart by
  `position_margin` along the axis. On the demo's 3x3 grid a relation between diagonal cells (one
  column over, two rows down) is "left of" by the caption and by `checks`, not by GenEval.
- counting: `checks` gives the count's partial credit clipped at 0 and, with a colour, asks every
  shape found to have it; GenEval's verdict counts "at least n" with the exclude clause "fewer
  than n + 1" (together: exactly n) and reads the colour of the first n.
The trained model's recorded accuracies were measured with `checks`, and its dense,
order-free values give the small demo a signal; `shape_verdict` gives the benchmark's reading.

Per-task scores: each sample falls in the group `geneval/<task>` (`omni_rl.reward.scores`), so
the manager logs `reward/geneval/single_object`, `.../two_object`, `.../counting`,
`.../colors`, `.../position`, `.../color_attr` beside `reward/geneval_shapes/mean`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from demos.shapes.grammar import CaptionError, SceneSpec, parse_caption
from demos.shapes.scene import COLOURS
from omni_rl.reward import Images, RewardScores, check_batch, register_reward, to_uint8_numpy

_PALETTE = np.array(list(COLOURS.values()), dtype=np.float32)  # [K, 3]
_NAMES = list(COLOURS)
_MIN_IOU = 0.75  # the least overlap of a component with its best-fitting shape


@dataclass(frozen=True)
class Detection:
    """One component: its shape (None: no known shape), colour, centroid (cx, cy) in units of the
    image side, area in pixels, the IoU of its best-fitting shape, and its bounding box in pixels
    (x0, y0, x1, y1; x1 and y1 exclusive: the box of the component's pixels, for GenEval's rules)."""

    shape: Optional[str]
    colour: str
    cx: float
    cy: float
    area: int
    iou: float
    box: Optional[tuple[int, int, int, int]] = None


def _components(mask: np.ndarray) -> np.ndarray:
    """4-connected components of a bool mask: int32 labels, -1 off the mask. Each pixel takes the
    least flat index in its component, by repeated minimum with its neighbours (a shape's
    components converge in about its diameter of rounds)."""
    height, width = mask.shape
    big = np.int32(height * width)
    labels = np.where(mask, np.arange(height * width, dtype=np.int32).reshape(height, width), big)
    while True:
        new = labels.copy()
        np.minimum(new[1:], labels[:-1], out=new[1:])
        np.minimum(new[:-1], labels[1:], out=new[:-1])
        np.minimum(new[:, 1:], labels[:, :-1], out=new[:, 1:])
        np.minimum(new[:, :-1], labels[:, 1:], out=new[:, :-1])
        new = np.where(mask, new, big)
        if np.array_equal(new, labels):
            return np.where(mask, labels, -1)
        labels = new


def _fit_shape(component: np.ndarray) -> tuple[Optional[str], float]:
    """(shape or None, its IoU) for one component, a bool mask over the whole image."""
    ys, xs = np.nonzero(component)
    area = len(xs)
    mx, my = xs.mean() + 0.5, ys.mean() + 0.5  # pixel centres, as the renderer samples them
    y0, x0 = max(ys.min() - 2, 0), max(xs.min() - 2, 0)  # a margin for the fitted shapes to spill into
    crop = component[y0 : ys.max() + 3, x0 : xs.max() + 3]
    dy = (np.arange(y0, y0 + crop.shape[0]) + 0.5)[:, None] - my
    dx = (np.arange(x0, x0 + crop.shape[1]) + 0.5)[None, :] - mx
    radius, half, height = np.sqrt(area / np.pi), np.sqrt(area) / 2, np.sqrt(2 * area)  # each of area `area`
    depth = dy + 2 * height / 3  # below the apex of an upright triangle whose centroid is (mx, my)
    fits = {
        "circle": dx**2 + dy**2 <= radius**2,
        "square": (np.abs(dx) <= half) & (np.abs(dy) <= half),
        "triangle": (depth >= 0) & (depth <= height) & (np.abs(dx) <= depth / 2),
    }
    ious = {name: float((crop & fit).sum() / (crop | fit).sum()) for name, fit in fits.items()}
    best = max(ious, key=ious.get)
    return (best if ious[best] >= _MIN_IOU else None), ious[best]


def detect(image: np.ndarray, colour_threshold: float = 80.0, min_area: float = 0.004) -> list[Detection]:
    """The shapes in one uint8 RGB image [H, W, 3] (see the module docstring)."""
    height, width = image.shape[:2]
    pixels = image.astype(np.float32)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    centres = np.concatenate([_PALETTE, np.median(border, axis=0)[None]])  # palette + background
    distance = np.linalg.norm(pixels[:, :, None, :] - centres[None, None], axis=-1)  # [H, W, K + 1]
    nearest = distance.argmin(axis=-1)
    close = distance.min(axis=-1) < colour_threshold
    found = []
    for k, name in enumerate(_NAMES):
        labels = _components((nearest == k) & close)
        ids, areas = np.unique(labels[labels >= 0], return_counts=True)
        for label, area in zip(ids, areas):
            if area < min_area * height * width:
                continue
            component = labels == label
            shape, iou = _fit_shape(component)
            ys, xs = np.nonzero(component)
            box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
            found.append(Detection(shape, name, float(xs.mean() + 0.5) / width, float(ys.mean() + 0.5) / height,
                                   int(area), iou, box))
    return found


def _relation_holds(a: Detection, b: Detection, relation: str, margin: float) -> bool:
    dx, dy = b.cx - a.cx, b.cy - a.cy
    return {"left_of": dx, "right_of": -dx, "above": dy, "below": -dy}[relation] > margin


def checks(spec: SceneSpec, found: Sequence[Detection], position_margin: float = 0.05) -> list[float]:
    """The value in [0, 1] of each check of `spec` on the detections (module docstring)."""
    values: list[float] = []
    matched_per_object = []
    for o in spec.objects:
        objs = [d for d in found if d.shape == o.shape]
        matched = [d for d in objs if o.colour is None or d.colour == o.colour]
        matched_per_object.append(matched)
        if spec.task == "counting":
            values.append(max(0.0, 1.0 - abs(len(objs) - o.count) / o.count))
            if o.colour is not None:
                values.append(float(bool(objs) and len(matched) == len(objs)))
        else:
            values.append(float(bool(objs)))
            if o.colour is not None or o.count > 1:
                values.append(float(len(matched) >= o.count))
    if spec.relation is not None:
        first, second = matched_per_object
        values.append(float(any(_relation_holds(a, b, spec.relation, position_margin) for a in first for b in second)))
    return values


def spec_of(prompt: str, metadata: dict) -> SceneSpec:
    """What to check: `metadata["geneval"]` (a SceneSpec or its dict) when given, else the parsed prompt."""
    given = metadata.get("geneval")
    if given is None:
        return parse_caption(prompt)
    return given if isinstance(given, SceneSpec) else SceneSpec.from_dict(given)


def _check_options(*, partial_credit: bool = False, colour_threshold: float = 80.0, min_area: float = 0.004,
                   position_margin: float = 0.05) -> None:
    if not isinstance(partial_credit, bool):
        raise ValueError(f"partial_credit={partial_credit!r}; expected true or false")
    if not 0 < colour_threshold <= 255:
        raise ValueError(f"colour_threshold={colour_threshold!r}; expected an RGB distance in (0, 255] (default 80)")
    if not 0 <= min_area < 0.25:
        raise ValueError(f"min_area={min_area!r}; expected a fraction of the image in [0, 0.25) (default 0.004)")
    if not 0 <= position_margin < 0.5:
        raise ValueError(f"position_margin={position_margin!r}; expected a fraction of the side in [0, 0.5) (default 0.05)")


def check_spec_item(prompt: str, metadata: dict) -> Optional[str]:
    """Why this prompt has no scene to check (`spec_of` fails), or None: run on every prompt
    before any model loads (`register_reward(check_item=...)`)."""
    try:
        spec_of(prompt, metadata)
    except CaptionError as err:
        return f"has no scene to check: {err}"
    return None


@register_reward("geneval_shapes", modalities={"image"}, check_options=_check_options, check_item=check_spec_item)
def geneval_shapes(*, partial_credit: bool = False, colour_threshold: float = 80.0, min_area: float = 0.004,
                   position_margin: float = 0.05):
    """1 when the image shows what the caption asks, else 0 (or the mean of the checks with
    `partial_credit`); groups `geneval/<task>` for the per-task metrics."""
    _check_options(partial_credit=partial_credit, colour_threshold=colour_threshold, min_area=min_area,
                   position_margin=position_margin)

    def score(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> RewardScores:
        check_batch(images, prompts, metadata)
        pixels = to_uint8_numpy(images)
        scores, groups = [], []
        for image, prompt, meta in zip(pixels, prompts, metadata):
            spec = spec_of(prompt, meta)
            values = checks(spec, detect(image, colour_threshold, min_area), position_margin)
            scores.append(float(np.mean(values)) if partial_credit else float(all(v == 1.0 for v in values)))
            groups.append(f"geneval/{spec.task}")
        return RewardScores(scores, groups)

    return score


__all__ = ["CaptionError", "Detection", "checks", "detect", "geneval_shapes", "spec_of"]
