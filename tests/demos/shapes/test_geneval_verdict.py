"""demos/shapes/geneval.py: the shape detector feeding GenEval's rules, on rendered scenes."""
import dataclasses
import json
from pathlib import Path

import pytest

from demos.shapes import ObjectSpec, Scene, SceneSpec, Shape, parse_caption, render, sample_pair
from demos.shapes.geneval import detected_objects, geneval_row, shape_verdict
from demos.shapes.reward import checks, detect
from omni_rl.eval.geneval_rules import parse_row

HELDOUT = Path(__file__).resolve().parents[3] / "recipes" / "prompts" / "geneval_shapes_heldout.jsonl"
NON_POSITION = ("single_object", "two_object", "counting", "colors", "color_attr")


def test_rows_are_written_as_genevals_generator_writes_them():
    assert geneval_row(parse_caption("three green triangles")) == {
        "tag": "counting", "include": [{"class": "triangle", "count": 3, "color": "green"}],
        "exclude": [{"class": "triangle", "count": 4}], "prompt": "three green triangles",
    }
    # "A left of B": the target B first, A pointing at clause 0.
    assert geneval_row(parse_caption("a square to the left of a triangle"))["include"] == [
        {"class": "triangle", "count": 1}, {"class": "square", "count": 1, "position": ["left of", 0]},
    ]


def test_detections_become_objects_with_their_pixel_box():
    # A 16 px square centred at (32, 32) of a 64 px image: r = 8 / 64; pixels 24..39 -> box (24, 24, 40, 40).
    image = render(Scene((Shape("square", "red", 0.5, 0.5, 0.125),)), 64)
    [found] = detect(image)
    assert found.box == (24, 24, 40, 40)
    [o] = detected_objects([found])
    assert (o.name, o.score, o.box, o.colour) == ("square", 1.0, (24.0, 24.0, 40.0, 40.0), "red")
    # A blob of no shape is no object.
    assert detected_objects([dataclasses.replace(found, shape=None)]) == []


@pytest.mark.parametrize("task", NON_POSITION)
@pytest.mark.parametrize("seed", range(6))
def test_verdict_is_correct_for_the_scene_of_the_caption(task, seed):
    pair = sample_pair(seed, task)
    v = shape_verdict(render(pair.scene, 64), pair.spec)
    assert v.correct and v.strict_correct and v.score == 1.0, (pair.caption, v.reason)


@pytest.mark.parametrize("seed", range(6))
def test_verdict_is_incorrect_for_a_scene_of_another_count(seed):
    pair = sample_pair(seed, "counting")
    only = pair.spec.objects[0]
    other = SceneSpec((dataclasses.replace(only, count=only.count + 1 if only.count < 4 else only.count - 1),))
    # The scene shows `only.count` shapes; the caption of the other count asks one more (too few)
    # or one fewer (the exclude clause count + 1 is hit): incorrect either way.
    v = shape_verdict(render(pair.scene, 64), other)
    assert not v.correct and not v.strict_correct, v.reason


def test_position_aligned_passes_and_the_diagonal_is_where_the_rules_differ():
    # A square at (1/6, 1/2) and a triangle at (1/2, 1/2): same row, a third of the side apart -> "left of".
    spec = parse_caption("a square to the left of a triangle")
    aligned = Scene((Shape("square", "red", 1 / 6, 0.5, 0.13), Shape("triangle", "blue", 0.5, 0.5, 0.13)))
    assert shape_verdict(render(aligned, 64), spec).correct
    assert not shape_verdict(render(aligned, 64), parse_caption("a square to the right of a triangle")).correct
    # One column over, two rows down: offset (1/3, 2/3) of the side; the margin 0.1 * (0.26 + 0.26) leaves
    # (0.28, 0.61), over |offset| = 0.745 that is dx = 0.38 < 0.5: GenEval sees "above", not "left of".
    # The demo's own checks see the square left of the triangle by more than their margin.
    diagonal = Scene((Shape("square", "red", 1 / 6, 1 / 6, 0.13), Shape("triangle", "blue", 0.5, 5 / 6, 0.13)))
    v = shape_verdict(render(diagonal, 64), spec)
    assert not v.correct and "found above" in v.reason
    assert checks(spec, detect(render(diagonal, 64))) == [1.0, 1.0, 1.0]


def test_every_heldout_caption_maps_to_a_row_the_rules_accept():
    lines = HELDOUT.read_text().splitlines()
    assert len(lines) > 30
    tags = set()
    for line in lines:
        record = json.loads(line)
        row = parse_row(geneval_row(parse_caption(record["prompt"])), where=record["prompt"])
        tags.add(row.tag)
    assert tags == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
