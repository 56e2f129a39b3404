"""GenEval's rules (Ghosh et al. 2023): from one image's detections and its metadata row to a verdict.

Pure numpy functions: `kept_objects`, `needs_colour`, `verdict`, `relative_position`,
`summary_scores`; open choices are listed in docs/evaluation.md.
Not here: detection and colour classification (the detector's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
GENEVAL_TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")
# GenEval's objects: COCO's 80 instance classes in their label order, named as GenEval names them
# (a COCO detector's label i is COCO_CLASSES[i]).
COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)

_CLAUSE_KEYS = {"include": {"class", "count", "color", "position"}, "exclude": {"class", "count"}}


@dataclass(frozen=True)
class GenEvalProtocol:
    """The rules' pinned constants (GenEval's evaluate_images.py defaults)."""

    threshold: float = 0.3  # confidence above which an object counts
    counting_threshold: float = 0.9  # the same, for rows tagged "counting"
    max_objects: int = 16  # per class, the most confident ones
    max_overlap: float = 1.0  # NMS IoU; 1.0 is off
    position_threshold: float = 0.1  # the margin of the position test, a fraction of the boxes' dimensions
    colours: tuple[str, ...] = COLOURS
    tasks: tuple[str, ...] = GENEVAL_TASKS

    def __post_init__(self) -> None:
        for name in ("threshold", "counting_threshold", "max_overlap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"GenEvalProtocol.{name}={value!r}; expected a number in [0, 1]")
        if isinstance(self.max_objects, bool) or not isinstance(self.max_objects, int) or self.max_objects < 1:
            raise ValueError(f"GenEvalProtocol.max_objects={self.max_objects!r}; expected a positive integer (GenEval: 16)")
        p = self.position_threshold
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 0.5:
            raise ValueError(f"GenEvalProtocol.position_threshold={p!r}; expected a number in [0, 0.5) (GenEval: 0.1)")

    def confidence_threshold(self, tag: str) -> float:
        return self.counting_threshold if tag == "counting" else self.threshold


@dataclass(frozen=True)
class DetectedObject:
    """One detected instance. box: (x0, y0, x1, y1) in pixels, x1 and y1 exclusive; mask: bool
    [H, W] or None; colour: one of COLOURS once classified (None until then)."""

    name: str
    score: float
    box: tuple[float, float, float, float]
    mask: Optional[np.ndarray] = None
    colour: Optional[str] = None


@dataclass(frozen=True)
class Clause:
    """One include or exclude clause: `count` objects of `name`, with an optional colour and an
    optional position (relation, index of an earlier include clause)."""

    name: str
    count: int
    colour: Optional[str] = None
    position: Optional[tuple[str, int]] = None


@dataclass(frozen=True)
class GenEvalRow:
    """A metadata row, checked: its tag, include and exclude clauses and prompt."""

    tag: str
    include: tuple[Clause, ...]
    exclude: tuple[Clause, ...] = ()
    prompt: str = ""


@dataclass(frozen=True)
class Verdict:
    """correct: GenEval's verdict; strict_correct and score: Flow-GRPO's reward (exact counts,
    partial credit); reason / strict_reason: the failed clauses of each reading ("" when none)."""

    correct: bool
    strict_correct: bool
    score: float
    reason: str
    strict_reason: str


RowLike = Union[GenEvalRow, Mapping[str, Any]]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _clause(raw: Any, kind: str, i: int, where: str) -> Clause:
    at = f"{where}: {kind}[{i}]"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{at} = {raw!r}; expected a dict like {{'class': 'dog', 'count': 2}}")
    unknown = sorted(set(raw) - _CLAUSE_KEYS[kind])
    if unknown:
        raise ValueError(f"{at} has unknown keys {unknown}; a {kind} clause holds {sorted(_CLAUSE_KEYS[kind])}")
    name, count = raw.get("class"), raw.get("count")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{at}['class'] = {name!r}; expected a class name such as 'dog'")
    if not _count(count):
        raise ValueError(f"{at}['count'] = {count!r}; expected a positive integer")
    colour = raw.get("color")
    if colour is not None and colour not in COLOURS:
        raise ValueError(f"{at}['color'] = {colour!r}; expected one of GenEval's colours {', '.join(COLOURS)}")
    position = raw.get("position")
    if position is not None:
        if (not isinstance(position, Sequence) or isinstance(position, str) or len(position) != 2
                or position[0] not in RELATIONS or not isinstance(position[1], int) or isinstance(position[1], bool)
                or not 0 <= position[1] < i):
            raise ValueError(
                f"{at}['position'] = {position!r}; expected [relation, index] with relation one of "
                f"{', '.join(RELATIONS)} and index that of an earlier include clause (0..{i - 1})"
            )
        position = (position[0], position[1])
    return Clause(name, count, colour, position)


def parse_row(row: RowLike, where: str = "row") -> GenEvalRow:
    """The checked `GenEvalRow` of a metadata row ({"tag", "include", "exclude"?, "prompt"?};
    other keys are ignored); a ValueError naming `where` and the bad value otherwise."""
    if isinstance(row, GenEvalRow):
        return row
    if not isinstance(row, Mapping):
        raise ValueError(f"{where} = {row!r:.80}; expected a GenEval metadata row (a dict with tag, include, exclude)")
    tag = row.get("tag")
    if tag not in GENEVAL_TASKS:
        raise ValueError(f"{where}: tag {tag!r}; expected one of GenEval's tasks {', '.join(GENEVAL_TASKS)}")
    clauses = {}
    for kind in ("include", "exclude"):
        raw = row.get(kind, [])
        if kind == "include" and kind not in row:
            raise ValueError(f"{where}: no 'include' clauses; a GenEval row lists what the image must show "
                             f"(e.g. include: [{{'class': 'dog', 'count': 1}}])")
        if not isinstance(raw, Sequence) or isinstance(raw, str):
            raise ValueError(f"{where}: {kind} = {raw!r:.80}; expected a list of clauses")
        clauses[kind] = tuple(_clause(c, kind, i, where) for i, c in enumerate(raw))
    prompt = row.get("prompt", "")
    if not isinstance(prompt, str):
        raise ValueError(f"{where}: prompt {prompt!r:.80}; expected a string")
    return GenEvalRow(tag, clauses["include"], clauses["exclude"], prompt)


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two boxes with GenEval's +1 on each side's length (0 when both are empty)."""
    def area(x0: float, y0: float, x1: float, y1: float) -> float:
        return max(x1 - x0 + 1, 0) * max(y1 - y0 + 1, 0)

    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a[:4]) + area(*b[:4]) - inter
    return inter / union if union else 0.0


def kept_objects(detections: Iterable[DetectedObject], row: RowLike,
                 rules: GenEvalProtocol = GenEvalProtocol()) -> dict[str, list[DetectedObject]]:
    """Per class, the objects the rules read (step 1 of the module docstring); a class with
    none is absent."""
    parsed = parse_row(row)
    threshold = rules.confidence_threshold(parsed.tag)
    by_class: dict[str, list[DetectedObject]] = {}
    for d in detections:
        if d.score > threshold:
            by_class.setdefault(d.name, []).append(d)
    kept = {}
    for name, objects in by_class.items():
        ordered = sorted(objects, key=lambda d: -d.score)[: rules.max_objects]  # stable: ties keep detector order
        chosen: list[DetectedObject] = []
        for d in ordered:
            if rules.max_overlap >= 1 or all(box_iou(d.box, c.box) < rules.max_overlap for c in chosen):
                chosen.append(d)
        kept[name] = chosen
    return kept


def needs_colour(kept: Mapping[str, Sequence[DetectedObject]], row: RowLike) -> list[tuple[str, int]]:
    """(class, index into kept[class]) of each object whose colour `verdict` will read, in
    clause order, each once."""
    wanted: list[tuple[str, int]] = []
    for clause in parse_row(row).include:
        found = kept.get(clause.name, [])
        if clause.colour is not None and len(found) >= clause.count:
            wanted.extend((clause.name, i) for i in range(clause.count) if (clause.name, i) not in wanted)
    return wanted


def relative_position(box_a: Sequence[float], box_b: Sequence[float], margin: float = 0.1) -> frozenset[str]:
    """The relations of A to B (step 4 of the module docstring), a subset of RELATIONS."""
    a = np.asarray(box_a[:4], dtype=np.float64).reshape(2, 2)  # rows: (x0, y0), (x1, y1)
    b = np.asarray(box_b[:4], dtype=np.float64).reshape(2, 2)
    offset = a.mean(axis=0) - b.mean(axis=0)
    dims = np.abs(a[1] - a[0]) + np.abs(b[1] - b[0])
    revised = np.sign(offset) * np.maximum(np.abs(offset) - margin * dims, 0.0)
    if np.all(np.abs(revised) < 1e-3):
        return frozenset()
    dx, dy = revised / np.linalg.norm(offset)
    found = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
    return frozenset(name for name, holds in found.items() if holds)


def _colours(objects: Sequence[DetectedObject], name: str) -> list[str]:
    for i, d in enumerate(objects):
        if d.colour is None:
            raise ValueError(
                f"the colour of {name} #{i} (score {d.score:.3f}, box {tuple(d.box)}) is needed by a colour clause but "
                f"is None; classify the objects `needs_colour(kept, row)` lists before asking for the verdict"
            )
    return [d.colour for d in objects]


def _pairs_fail(objects: Sequence[DetectedObject], targets: Sequence[DetectedObject], relation: str,
                margin: float) -> Optional[frozenset[str]]:
    """The relations found for the first pair that lacks `relation` (None when every pair has it)."""
    for obj in objects:
        for target in targets:
            found = relative_position(obj.box, target.box, margin)
            if relation not in found:
                return found
    return None


def _geneval(kept: Mapping[str, Sequence[DetectedObject]], row: GenEvalRow, margin: float) -> tuple[bool, list[str]]:
    """GenEval's reading: at-least counts on the most confident objects; excludes apply."""
    failures: list[str] = []
    groups: list[Optional[Sequence[DetectedObject]]] = []
    for clause in row.include:
        found = list(kept.get(clause.name, []))[: clause.count]
        holds = len(found) >= clause.count
        if not holds:
            failures.append(f"{clause.name}: expected at least {clause.count}, found {len(found)}")
        elif clause.colour is not None:
            colours = _colours(found, clause.name)
            if colours.count(clause.colour) < clause.count:
                holds = False
                seen = ", ".join(f"{colours.count(c)} {c}" for c in COLOURS if c in colours)
                failures.append(f"{clause.name}: expected {clause.count} {clause.colour}, found {seen}")
        if holds and clause.position is not None:
            failure = _position_failure(clause, found, groups, margin)
            if failure is not None:
                holds = False
                failures.append(failure)
        groups.append(found if holds else None)
    for clause in row.exclude:
        n = len(kept.get(clause.name, []))
        if n >= clause.count:
            failures.append(f"{clause.name}: expected fewer than {clause.count}, found {n}")
    return not failures, failures


def _position_failure(clause, found: Sequence[DetectedObject], groups: list, margin: float) -> Optional[str]:
    """Why `clause`'s position test fails on `found` against its target clause's objects (None
    when it holds): the target clause failed, or some pair is not in the relation."""
    relation, target = clause.position
    if groups[target] is None:
        return f"{clause.name}: no target for '{relation}' (clause {target} failed)"
    wrong = _pairs_fail(found, groups[target], relation, margin)
    if wrong is None:
        return None
    return f"{clause.name}: expected {relation} the target, found {' and '.join(sorted(wrong)) or 'no relation'}"


def _flow_grpo(kept: Mapping[str, Sequence[DetectedObject]], row: GenEvalRow,
               margin: float) -> tuple[bool, float, list[str]]:
    """Flow-GRPO's reading: exact counts over all kept objects, partial-credit terms."""
    failures: list[str] = []
    terms: list[float] = []
    groups: list[Optional[Sequence[DetectedObject]]] = []
    for clause in row.include:
        found = list(kept.get(clause.name, []))
        terms.append(1.0 - abs(clause.count - len(found)) / clause.count)
        holds = len(found) == clause.count
        if not holds:
            failures.append(f"{clause.name}: expected exactly {clause.count}, found {len(found)}")
            if clause.colour is not None or clause.position is not None:
                terms.append(0.0)
        else:
            if clause.colour is not None:
                coloured = _colours(found, clause.name).count(clause.colour)
                terms.append(1.0 - abs(clause.count - coloured) / clause.count)
                if coloured != clause.count:
                    holds = False
                    failures.append(f"{clause.name}: expected exactly {clause.count} {clause.colour}, found {coloured}")
            if clause.position is not None and holds:
                failure = _position_failure(clause, found, groups, margin)
                if failure is not None:
                    holds = False
                    failures.append(failure)
                    terms.append(0.0)
                if groups[clause.position[1]] is not None:
                    terms.append(1.0)  # Flow-GRPO's term after the pair test, whichever way it went
        groups.append(found if holds else None)
    score = float(np.mean(terms)) if terms else 0.0
    return not failures, score, failures


def verdict(kept: Mapping[str, Sequence[DetectedObject]], row: RowLike,
            rules: GenEvalProtocol = GenEvalProtocol()) -> Verdict:
    """Both readings of `row` on the kept objects (step 3 of the module docstring). An object
    whose colour a clause reads but which has none is a ValueError naming it."""
    parsed = parse_row(row)
    correct, reasons = _geneval(kept, parsed, rules.position_threshold)
    strict, score, strict_reasons = _flow_grpo(kept, parsed, rules.position_threshold)
    return Verdict(correct, strict, score, "; ".join(reasons), "; ".join(strict_reasons))


def summary_scores(tags: Sequence[str], prompt_keys: Sequence[Any], correct: Sequence[bool]) -> dict[str, Any]:
    """GenEval's aggregation over images: {"tasks": {tag: accuracy}, "overall": the unweighted mean
    of the task accuracies, "correct_images": the fraction of correct images, "correct_prompts":
    the fraction of prompts (by `prompt_keys`) with at least one correct image, "images", "prompts"}."""
    if not (len(tags) == len(prompt_keys) == len(correct)) or not tags:
        raise ValueError(f"summary_scores: {len(tags)} tags, {len(prompt_keys)} prompt keys and {len(correct)} "
                         f"verdicts; expected one of each per image, at least one image")
    by_task: dict[str, list[bool]] = {}
    by_prompt: dict[Any, bool] = {}
    for tag, key, ok in zip(tags, prompt_keys, correct):
        by_task.setdefault(tag, []).append(bool(ok))
        by_prompt[key] = by_prompt.get(key, False) or bool(ok)
    tasks = {tag: float(np.mean(values)) for tag, values in by_task.items()}
    return {
        "tasks": tasks,
        "overall": float(np.mean(list(tasks.values()))),
        "correct_images": float(np.mean([bool(c) for c in correct])),
        "correct_prompts": float(np.mean(list(by_prompt.values()))),
        "images": len(correct),
        "prompts": len(by_prompt),
    }
