"""demos.shapes (scene, grammar, sampling, prompt_files): the renderer, the caption grammar and its parser, matching pairs, the prompt files."""
import itertools
import json

import numpy as np
import pytest

from demos.shapes import (
    BACKGROUND, COLOURS, RELATIONS, SHAPES, TASKS, CaptionError, ObjectSpec, Scene, SceneSpec, Shape,
    all_specs, caption_of, layout, parse_caption, prompt_splits, render, sample_pair,
)
from demos.shapes.sampling import EDGE, GAP, GRID, RADIUS, RELATION_OFFSET
from omni_rl.data.prompts import read_prompt_file

EVERY_SPEC = [spec for task in TASKS for spec in all_specs(task)]


# --- the renderer ---------------------------------------------------------------------------
def test_shapes_fill_their_boxes_as_their_geometry_says():
    """At 128 px a centred shape of half-extent 0.25 (a 64 px box) fills ~1, ~pi/4, ~1/2 of it."""
    for shape, expected in [("square", 1.0), ("circle", np.pi / 4), ("triangle", 0.5)]:
        image = render(Scene((Shape(shape, "red", 0.5, 0.5, 0.25),)), 128)
        painted = (image == COLOURS["red"]).all(-1)
        assert painted.sum() / 64**2 == pytest.approx(expected, abs=0.02)
        assert (image[~painted] == BACKGROUND).all()


def test_the_triangle_points_up():
    mask = (render(Scene((Shape("triangle", "blue", 0.5, 0.5, 0.25),)), 64) == COLOURS["blue"]).all(-1)
    rows = mask.sum(axis=1)[mask.any(axis=1)]
    assert rows[0] < rows[-1] and list(rows) == sorted(rows)


@pytest.mark.parametrize("size", [32, 48, 64, 96, 128])
def test_every_pixel_is_the_background_or_a_palette_colour(size):
    """No anti-aliasing: the detector can segment by colour exactly."""
    allowed = {BACKGROUND, *COLOURS.values()}
    for seed in range(20):
        image = render(sample_pair(seed).scene, size)
        assert image.shape == (size, size, 3) and image.dtype == np.uint8
        assert {tuple(int(v) for v in p) for p in image.reshape(-1, 3)} <= allowed


def test_rendering_is_deterministic_and_refuses_bad_input():
    scene = sample_pair(7).scene
    assert np.array_equal(render(scene), render(scene)) and render(scene).shape == (64, 64, 3)
    with pytest.raises(ValueError, match="size=4"):
        render(scene, 4)
    with pytest.raises(ValueError, match="shape='hexagon'"):
        Shape("hexagon", "red", 0.5, 0.5, 0.1)
    with pytest.raises(ValueError, match="colour='purple'"):
        Shape("circle", "purple", 0.5, 0.5, 0.1)


# --- the grammar ----------------------------------------------------------------------------
def test_every_generated_caption_round_trips():
    assert len(EVERY_SPEC) == 3 + 6 + 45 + 12 + 312 + 72
    for spec in EVERY_SPEC:
        caption = caption_of(spec)
        assert parse_caption(caption) == spec, caption
        assert SceneSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    for task in TASKS:
        assert {spec.task for spec in all_specs(task)} == {task}
    assert len({caption_of(s) for s in EVERY_SPEC}) == len(EVERY_SPEC)


@pytest.mark.parametrize("caption, task, objects, relation", [
    ("a circle", "single_object", [("circle", 1, None)], None),
    ("a yellow square", "colors", [("square", 1, "yellow")], None),
    ("three green triangles", "counting", [("triangle", 3, "green")], None),
    ("two squares", "counting", [("square", 2, None)], None),
    ("a circle and a square", "two_object", [("circle", 1, None), ("square", 1, None)], None),
    ("a red circle and a square", "two_object", [("circle", 1, "red"), ("square", 1, None)], None),
    ("a red circle and a blue triangle", "color_attr", [("circle", 1, "red"), ("triangle", 1, "blue")], None),
    ("a blue square to the left of a green triangle", "position", [("square", 1, "blue"), ("triangle", 1, "green")], "left_of"),
    ("A photo of a circle right of a triangle.", "position", [("circle", 1, None), ("triangle", 1, None)], "right_of"),
    ("  one square above an triangle ", "position", [("square", 1, None), ("triangle", 1, None)], "above"),
    ("a circle below a square", "position", [("circle", 1, None), ("square", 1, None)], "below"),
    ("two circles and a square", "two_object", [("circle", 2, None), ("square", 1, None)], None),
])
def test_captions_parse_to_their_spec(caption, task, objects, relation):
    spec = parse_caption(caption)
    assert spec == SceneSpec(tuple(ObjectSpec(*o) for o in objects), relation) and spec.task == task


@pytest.mark.parametrize("caption, why", [
    ("", "an object is missing"),
    ("circle", "'circle' is not a count"),
    ("a purple circle", "'purple' is not a shape"),
    ("a red", "the shape is missing"),
    ("two circle", "should read two 'circles'"),
    ("a circles", "should read a 'circle'"),
    ("five circles", "'five' is not a count"),
    ("a circle and a circle", "must be different shapes"),
    ("four circles and a square", "at most 4"),
    ("two circles to the left of a square", "two single objects"),
    ("a circle beside a square", "neither 'and' nor a relation"),
    ("a circle and a square and a triangle", "left over"),
    ("a circle and", "an object is missing"),
])
def test_bad_captions_raise_naming_the_caption(caption, why):
    with pytest.raises(CaptionError) as info:
        parse_caption(caption)
    assert str(info.value).startswith(f"caption {caption!r}: ") and why in str(info.value)


def test_bad_specs_raise():
    with pytest.raises(CaptionError, match="task 'counting'"):
        SceneSpec.from_dict({"task": "counting", "objects": [{"shape": "circle"}]})
    with pytest.raises(CaptionError, match="unknown keys"):
        SceneSpec.from_dict({"objects": [{"shape": "circle"}], "colour": "red"})
    with pytest.raises(CaptionError, match="count 2.5"):
        SceneSpec.from_dict({"objects": [{"shape": "circle", "count": 2.5}]})
    with pytest.raises(CaptionError, match="relation 'near'"):
        SceneSpec((ObjectSpec("circle"), ObjectSpec("square")), "near")


# --- matching pairs -------------------------------------------------------------------------
def _apart(a: Shape, b: Shape) -> bool:
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    return max(bx0 - ax1, ax0 - bx1) >= GAP or max(by0 - ay1, ay0 - by1) >= GAP


@pytest.mark.parametrize("task", TASKS)
def test_layouts_hold_exactly_what_the_caption_names(task):
    rng = np.random.default_rng(3)
    for spec in all_specs(task)[:40]:
        scene = layout(spec, rng)
        wanted = sorted((o.shape, o.colour) for o in spec.objects for _ in range(o.count))
        got = sorted((s.shape, s.colour) for s in scene.shapes)
        assert [w[0] for w in wanted] == [g[0] for g in got]
        assert all(w[1] in (None, g[1]) for w, g in zip(wanted, got))
        assert all(EDGE - 1e-9 <= v <= 1 - EDGE + 1e-9 for s in scene.shapes for v in s.box)
        assert all(_apart(a, b) for a, b in itertools.combinations(scene.shapes, 2))
        if spec.relation:
            a, b = scene.shapes
            offset = {"left_of": b.cx - a.cx, "right_of": a.cx - b.cx, "above": b.cy - a.cy, "below": a.cy - b.cy}
            assert offset[spec.relation] >= RELATION_OFFSET


def test_layouts_put_each_shape_in_its_own_grid_cell():
    assert GAP > 0.05 and EDGE > 0.02  # 32 px: over 1.5 px between shapes, and from the edge
    rng = np.random.default_rng(4)
    for spec in all_specs("counting"):
        scene = layout(spec, rng)
        cells = [(round(s.cx * GRID - 0.5), round(s.cy * GRID - 0.5)) for s in scene.shapes]
        assert all(s.cx == pytest.approx((i + 0.5) / GRID) and s.cy == pytest.approx((j + 0.5) / GRID)
                   for s, (i, j) in zip(scene.shapes, cells))
        assert len(set(cells)) == len(cells) and all(s.r == RADIUS for s in scene.shapes)


def test_pairs_are_deterministic_and_cover_every_task():
    assert sample_pair(11) == sample_pair(11) and sample_pair(11) != sample_pair(12)
    assert sample_pair(5, "counting").spec.task == "counting"
    pairs = [sample_pair(seed) for seed in range(120)]
    assert {p.spec.task for p in pairs} == set(TASKS)
    assert all(parse_caption(p.caption) == p.spec for p in pairs)
    with pytest.raises(ValueError, match="task='geneval'"):
        all_specs("geneval")


# --- the prompt files -----------------------------------------------------------------------
def test_the_splits_are_disjoint_by_caption_and_cover_every_task():
    train, heldout = prompt_splits(0)
    train_captions, heldout_captions = {caption_of(s) for s in train}, {caption_of(s) for s in heldout}
    assert len(train_captions) == len(train) and len(heldout_captions) == len(heldout)
    assert not train_captions & heldout_captions
    assert {s.task for s in train} == {s.task for s in heldout} == set(TASKS)
    assert prompt_splits(0) == (train, heldout) and prompt_splits(1) != (train, heldout)


def test_the_prompt_files_are_what_the_script_writes():
    from demos.shapes import prompt_files as script

    for split, path in script.FILES.items():
        assert path.read_text(encoding="utf-8").splitlines() == script.rows(split), f"rerun {script.__file__}"
        items = read_prompt_file(str(path))
        assert all(SceneSpec.from_dict(i.metadata["geneval"]) == parse_caption(i.prompt) for i in items)
