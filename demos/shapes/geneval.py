"""The shape demo's detector as one GenEval detector: its scenes judged by GenEval's own rules.

- `detected_objects(found)`: `demos.shapes.reward.detect`'s `Detection`s as the rules'
  `DetectedObject`s: class = the shape's name, score 1.0 (the detector has no confidence: every
  component it fits is certain, so both of GenEval's thresholds keep it), the component's pixel
  box, its colour as detected (the palette's four colours are among GenEval's ten). A component
  of no shape (a blob) is no object of any class and is left out.
- `geneval_row(spec)`: a caption's `SceneSpec` as a GenEval metadata row, written as GenEval's
  prompt generator writes its rows: one include clause per object (class, count, and a colour
  when the caption names one); counting adds the exclude clause {class, count + 1}; a position
  row ("A left of B") lists the target B first and gives A the position ["left of", 0].
- `shape_verdict(image, spec)`: `omni_rl.eval.geneval_rules.verdict` on the image's detections.

Where GenEval's rules and the demo's own (`demos.shapes.reward.checks`) differ is said in
`demos.shapes.reward`'s docstring.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from demos.shapes.grammar import SceneSpec, caption_of
from demos.shapes.reward import Detection, detect
from omni_rl.eval.geneval_rules import DetectedObject, GenEvalProtocol, Verdict, kept_objects, verdict

# The grammar's relation keys as GenEval's rows write them.
GENEVAL_RELATIONS = {"left_of": "left of", "right_of": "right of", "above": "above", "below": "below"}


def detected_objects(found: Sequence[Detection]) -> list[DetectedObject]:
    """The rules' objects of the shape detector's detections (blobs of no shape left out)."""
    objects = []
    for d in found:
        if d.shape is None:
            continue
        if d.box is None:
            raise ValueError(f"detection {d!r} has no box; detections from demos.shapes.reward.detect carry one")
        objects.append(DetectedObject(d.shape, 1.0, tuple(float(v) for v in d.box), colour=d.colour))
    return objects


def _clause(shape: str, count: int, colour: str | None) -> dict[str, Any]:
    clause: dict[str, Any] = {"class": shape, "count": count}
    if colour is not None:
        clause["color"] = colour
    return clause


def geneval_row(spec: SceneSpec) -> dict[str, Any]:
    """The GenEval metadata row of `spec` (module docstring), with the caption as its prompt."""
    row: dict[str, Any] = {"tag": spec.task}
    if spec.relation is not None:
        subject, target = spec.objects
        row["include"] = [
            _clause(target.shape, target.count, target.colour),
            {**_clause(subject.shape, subject.count, subject.colour),
             "position": [GENEVAL_RELATIONS[spec.relation], 0]},
        ]
    else:
        row["include"] = [_clause(o.shape, o.count, o.colour) for o in spec.objects]
    if spec.task == "counting":
        only = spec.objects[0]
        row["exclude"] = [{"class": only.shape, "count": only.count + 1}]
    row["prompt"] = caption_of(spec)
    return row


def shape_verdict(image: np.ndarray, spec: SceneSpec, rules: GenEvalProtocol = GenEvalProtocol(),
                  **detect_options: float) -> Verdict:
    """GenEval's verdict on one uint8 RGB shape image [H, W, 3] for `spec`'s caption;
    `detect_options` are `detect`'s (`colour_threshold`, `min_area`)."""
    row = geneval_row(spec)
    kept = kept_objects(detected_objects(detect(image, **detect_options)), row, rules)
    return verdict(kept, row, rules)
