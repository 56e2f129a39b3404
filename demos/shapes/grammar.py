"""The caption grammar of the shape scenes, GenEval's six task types, and its parser.

    caption  := ["a photo of "] phrase [" and " phrase | " " relation " " phrase] ["."]
    phrase   := count [colour] shape      (the shape plural when count > 1: "three circles")
    count    := "a" | "an" | "one" | "two" | "three" | "four"
    colour   := "red" | "green" | "blue" | "yellow"
    shape    := "circle" | "square" | "triangle"
    relation := ["to the "] "left of" | ["to the "] "right of" | "above" | "below"

Case and surrounding spaces are ignored. A caption names one or two objects; two objects are
different shapes; at most four shapes in all; a relation joins two single objects ("a square
to the left of a triangle": the square's centre is left of the triangle's). What a caption
asks, `SceneSpec`, is checked by the GenEval-style reward (`demos.shapes.reward`); its
task type follows from its form, as in GenEval's prompt sets:

| task          | form                                    | example                                      |
|---------------|-----------------------------------------|----------------------------------------------|
| single_object | one object, no colour                   | a circle                                     |
| colors        | one object with a colour                | a yellow square                              |
| counting      | one phrase of two to four               | three green triangles, two squares           |
| two_object    | two objects, not both coloured          | a circle and a square                        |
| color_attr    | two objects, both coloured (binding)    | a red circle and a blue triangle             |
| position      | two objects and a relation              | a blue square to the left of a green triangle |

`parse_caption(text) -> SceneSpec` reads any caption of the grammar (a `CaptionError` naming the
caption otherwise); `caption_of(spec)` writes the canonical caption, and
`parse_caption(caption_of(spec)) == spec` for every spec. `SceneSpec.to_dict` / `from_dict` is
the form a prompt file's metadata carries (`metadata["geneval"]`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from demos.shapes.scene import COLOURS, SHAPES

TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
# Relation key -> its canonical words. "A <relation> B" compares A's centre with B's.
RELATIONS = {"left_of": "to the left of", "right_of": "to the right of", "above": "above", "below": "below"}
MAX_COUNT = 4  # shapes in a scene, at most
_COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}
_CANONICAL_COUNTS = {1: "a", 2: "two", 3: "three", 4: "four"}
_RELATION_WORDS = [
    (("to", "the", "left", "of"), "left_of"), (("left", "of"), "left_of"),
    (("to", "the", "right", "of"), "right_of"), (("right", "of"), "right_of"),
    (("above",), "above"), (("below",), "below"),
]
_PREFIXES = (("a", "photo", "of"), ("an", "image", "of"))
# Every word a caption of this grammar may hold (what a tokenizer for it needs as whole words).
VOCABULARY = tuple(sorted(
    set(COLOURS) | set(SHAPES) | {f"{shape}s" for shape in SHAPES} | set(_COUNT_WORDS) | {"and"}
    | {w for words, _ in _RELATION_WORDS for w in words} | {w for prefix in _PREFIXES for w in prefix}
))
EXPECTED = (
    'a caption like "a red circle", "three green triangles", "a circle and a square" or "a blue square '
    'to the left of a green triangle" (counts a/one/two/three/four; colours red, green, blue, yellow; '
    'shapes circle, square, triangle; relations left of, right of, above, below)'
)


class CaptionError(ValueError):
    """A caption outside the grammar, or a spec no scene can satisfy; the message names it."""


@dataclass(frozen=True)
class ObjectSpec:
    """`count` shapes of kind `shape`, all of `colour` (None: any colour)."""

    shape: str
    count: int = 1
    colour: Optional[str] = None


@dataclass(frozen=True)
class SceneSpec:
    """What a caption asks: one or two objects and, with two, an optional relation
    (`objects[0]` <relation> `objects[1]`, a key of RELATIONS)."""

    objects: tuple[ObjectSpec, ...]
    relation: Optional[str] = None

    def __post_init__(self) -> None:
        problem = _problem(self.objects, self.relation)
        if problem:
            raise CaptionError(f"{self!r}: {problem}")

    @property
    def task(self) -> str:
        """The GenEval task type, from the form (see the module's table)."""
        if self.relation is not None:
            return "position"
        if len(self.objects) == 1:
            only = self.objects[0]
            return "counting" if only.count > 1 else ("colors" if only.colour else "single_object")
        return "color_attr" if all(o.colour for o in self.objects) else "two_object"

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "objects": [{"shape": o.shape, "count": o.count, "colour": o.colour} for o in self.objects],
            "relation": self.relation,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "SceneSpec":
        """The spec of `to_dict`'s form; "task", when given, must be the one the form has."""
        if not isinstance(data, dict) or not isinstance(data.get("objects"), list):
            raise CaptionError(f"geneval spec {data!r}: expected a dict with 'objects' (a list) as SceneSpec.to_dict writes")
        unknown = sorted(set(data) - {"task", "objects", "relation"})
        if unknown:
            raise CaptionError(f"geneval spec {data!r}: unknown keys {unknown}; expected task, objects, relation")
        try:
            objects = tuple(ObjectSpec(o["shape"], o.get("count", 1), o.get("colour")) for o in data["objects"])
        except (TypeError, KeyError, AttributeError):
            raise CaptionError(
                f"geneval spec {data!r}: each object must be a dict with 'shape' (and optional 'count', 'colour')"
            ) from None
        spec = cls(objects, data.get("relation"))
        task = data.get("task")
        if task is not None and task != spec.task:
            raise CaptionError(f"geneval spec {data!r}: task {task!r} but its objects and relation make a {spec.task!r} spec")
        return spec


def _problem(objects: tuple[ObjectSpec, ...], relation: Optional[str]) -> str:
    """Why no scene of the grammar can hold these objects and relation ("" when one can)."""
    if not 1 <= len(objects) <= 2:
        return f"{len(objects)} objects; a caption names one or two"
    for o in objects:
        if o.shape not in SHAPES:
            return f"shape {o.shape!r}; expected one of {', '.join(SHAPES)}"
        if o.colour is not None and o.colour not in COLOURS:
            return f"colour {o.colour!r}; expected one of {', '.join(COLOURS)}"
        if not (isinstance(o.count, int) and 1 <= o.count <= MAX_COUNT):
            return f"count {o.count!r}; expected 1 to {MAX_COUNT}"
    if sum(o.count for o in objects) > MAX_COUNT:
        return f"{sum(o.count for o in objects)} shapes; a scene holds at most {MAX_COUNT}"
    if len(objects) == 2 and objects[0].shape == objects[1].shape:
        return f"two objects of one shape ({objects[0].shape}); the two objects must be different shapes"
    if relation is not None:
        if relation not in RELATIONS:
            return f"relation {relation!r}; expected one of {', '.join(RELATIONS)}"
        if len(objects) != 2 or any(o.count != 1 for o in objects):
            return "a relation joins two single objects (count 1 each)"
    return ""


def _phrase(o: ObjectSpec) -> str:
    words = [_CANONICAL_COUNTS[o.count]] + ([o.colour] if o.colour else []) + [o.shape + ("s" if o.count > 1 else "")]
    return " ".join(words)


def caption_of(spec: SceneSpec) -> str:
    """The canonical caption of `spec` ("a red circle", "a square to the left of a triangle")."""
    if len(spec.objects) == 1:
        return _phrase(spec.objects[0])
    joint = "and" if spec.relation is None else RELATIONS[spec.relation]
    return f"{_phrase(spec.objects[0])} {joint} {_phrase(spec.objects[1])}"


def parse_caption(text: str) -> SceneSpec:
    """The `SceneSpec` of a caption of the grammar; `CaptionError` naming the caption otherwise."""
    if not isinstance(text, str):
        raise CaptionError(f"caption {text!r}: expected a string, got {type(text).__name__}")
    words = text.strip().lower().rstrip(".").split()
    for prefix in _PREFIXES:
        if tuple(words[: len(prefix)]) == prefix:
            words = words[len(prefix) :]
            break
    first, rest = _read_phrase(words, text)
    objects, relation = [first], None
    if rest:
        if rest[0] == "and":
            rest = rest[1:]
        else:
            for relation_words, key in _RELATION_WORDS:
                if tuple(rest[: len(relation_words)]) == relation_words:
                    relation, rest = key, rest[len(relation_words) :]
                    break
            else:
                raise CaptionError(f"caption {text!r}: {' '.join(rest)!r} is neither 'and' nor a relation; expected {EXPECTED}")
        second, rest = _read_phrase(rest, text)
        objects.append(second)
        if rest:
            raise CaptionError(f"caption {text!r}: {' '.join(rest)!r} left over after two objects; expected {EXPECTED}")
    problem = _problem(tuple(objects), relation)
    if problem:
        raise CaptionError(f"caption {text!r}: {problem}")
    return SceneSpec(tuple(objects), relation)


def _read_phrase(words: list[str], text: str) -> tuple[ObjectSpec, list[str]]:
    """One `count [colour] shape` phrase from the front of `words`, and the words after it."""
    if not words:
        raise CaptionError(f"caption {text!r}: an object is missing; expected {EXPECTED}")
    if words[0] not in _COUNT_WORDS:
        raise CaptionError(f"caption {text!r}: {words[0]!r} is not a count (a, one, two, three, four); expected {EXPECTED}")
    count, i = _COUNT_WORDS[words[0]], 1
    colour = None
    if i < len(words) and words[i] in COLOURS:
        colour, i = words[i], i + 1
    if i >= len(words):
        raise CaptionError(f"caption {text!r}: the shape is missing after {' '.join(words[:i])!r}; expected {EXPECTED}")
    word = words[i]
    shape = word[:-1] if word.endswith("s") and word[:-1] in SHAPES else word
    if shape not in SHAPES:
        raise CaptionError(f"caption {text!r}: {word!r} is not a shape (circle, square, triangle); expected {EXPECTED}")
    plural = shape != word
    if plural != (count > 1):
        wanted = shape + "s" if count > 1 else shape
        raise CaptionError(f"caption {text!r}: {words[0]} {word!r} should read {words[0]} {wanted!r}")
    return ObjectSpec(shape, count, colour), words[i + 1 :]
