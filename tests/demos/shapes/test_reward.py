"""demos/shapes/reward.py (`geneval_shapes`): scenes of known contents, drawn by demos.shapes.scene, scored against their captions."""
import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from demos.shapes import (
    TASKS, ObjectSpec, Scene, SceneSpec, Shape, caption_of, parse_caption, render, sample_pair,
)
from demos.shapes.reward import detect
from omni_rl.reward import RewardConfigError, build_reward
from omni_rl.reward.manager import RewardError, RewardManager, RewardSpec
from omni_rl.reward.registry import check_reward_options, reward_modalities

SIZES = (32, 48, 64, 128)
SEEDS = range(16)
OPPOSITE = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}


def score(captions, scenes, size=64, metadata=None, **options):
    images = torch.from_numpy(np.stack([render(s, size) for s in scenes]))
    out = build_reward("geneval_shapes", **options)(images, list(captions), metadata or [{} for _ in captions])
    return out.scores


def mismatch(spec: SceneSpec, scene: Scene) -> SceneSpec:
    """A spec of the same task that the scene of `spec` contradicts."""
    first = spec.objects[0]
    present = {s.shape for s in scene.shapes}
    missing = next(s for s in ("circle", "square", "triangle") if s not in present)
    if spec.task == "single_object":
        return SceneSpec((ObjectSpec(missing),))
    if spec.task == "colors":
        other = next(c for c in ("red", "green", "blue", "yellow") if c != first.colour)
        return SceneSpec((dataclasses.replace(first, colour=other),))
    if spec.task == "counting":
        return SceneSpec((dataclasses.replace(first, count=first.count + 1 if first.count < 4 else 3),))
    if spec.task == "two_object":
        return SceneSpec((first, ObjectSpec(missing)))
    if spec.task == "color_attr":  # the colours swapped: binding matters
        a, b = spec.objects
        return SceneSpec((dataclasses.replace(a, colour=b.colour), dataclasses.replace(b, colour=a.colour)))
    return SceneSpec(spec.objects, OPPOSITE[spec.relation])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("task", TASKS)
def test_matching_captions_score_one_and_mismatching_ones_zero(task, size):
    pairs = [sample_pair(1000 * TASKS.index(task) + seed, task) for seed in SEEDS]
    wrong = [caption_of(mismatch(p.spec, p.scene)) for p in pairs]
    scenes = [p.scene for p in pairs]
    assert score([p.caption for p in pairs], scenes, size) == [1.0] * len(pairs)
    assert score(wrong, scenes, size) == [0.0] * len(pairs), wrong
    assert all(s < 1.0 for s in score(wrong, scenes, size, partial_credit=True))


def test_the_detector_finds_what_was_drawn():
    scene = Scene((Shape("circle", "red", 0.25, 0.25, 0.15), Shape("square", "blue", 0.75, 0.3, 0.12),
                   Shape("triangle", "yellow", 0.5, 0.75, 0.15)))
    found = sorted(detect(render(scene, 64)), key=lambda d: d.shape)
    assert [(d.shape, d.colour) for d in found] == [("circle", "red"), ("square", "blue"), ("triangle", "yellow")]
    assert [(round(d.cx, 2), round(d.cy, 2)) for d in found[:2]] == [(0.25, 0.25), (0.75, 0.3)]
    assert found[2].cy > 0.75  # a triangle's centroid lies below its box's centre (2/3 of the way down)


def test_noise_and_specks_do_not_change_the_answer():
    pair = sample_pair(3, "color_attr")
    image = render(pair.scene, 64).astype(np.int16)
    image += np.random.default_rng(0).integers(-20, 21, size=image.shape, dtype=np.int16)
    image[5, 5] = (220, 40, 40)  # a one-pixel red speck: below min_area
    batch = torch.from_numpy(np.clip(image, 0, 255).astype(np.uint8))[None]
    assert build_reward("geneval_shapes")(batch, [pair.caption], [{}]).scores == [1.0]


@pytest.mark.parametrize("size", [32, 64, 128])
def test_a_blurred_generators_shapes_are_still_found(size):
    """A Gaussian blur of 1 px per 64 px (a small generator's soft edges) changes no answer."""
    for seed in range(60):
        pair = sample_pair(500 + seed)
        blurred = Image.fromarray(render(pair.scene, size)).filter(ImageFilter.GaussianBlur(size / 64))
        assert build_reward("geneval_shapes")([blurred], [pair.caption], [{}]).scores == [1.0], pair.caption


def test_a_blob_of_no_shape_is_no_shape():
    image = np.full((64, 64, 3), 200, dtype=np.uint8)
    image[10:20, 10:40] = (40, 80, 220)  # a 3:1 blue bar
    image[30:50, 30:50] = (220, 40, 40)
    image[30:40, 30:40] = 200  # a red L
    assert [d.shape for d in detect(image)] == [None, None]


# --- partial credit, by hand ----------------------------------------------------------------
GREEN_TRIANGLES = (Shape("triangle", "green", 0.2, 0.2, 0.12), Shape("triangle", "green", 0.7, 0.2, 0.12))
PARTIAL = [
    # counting: count = 1 - |3 - 3| / 3 = 1, colour = 0 (one triangle is red): (1 + 0) / 2
    ("three green triangles", GREEN_TRIANGLES + (Shape("triangle", "red", 0.5, 0.7, 0.12),), 0.5),
    # counting: count = 1 - |2 - 3| / 3 = 2/3, colour = 1: (2/3 + 1) / 2 = 5/6
    ("three green triangles", GREEN_TRIANGLES, 5 / 6),
    # counting: count = 1 - |2 - 4| / 4 = 1/2, no colour asked
    ("four triangles", GREEN_TRIANGLES, 0.5),
    # colour attribution with the colours swapped: circle present 1, red 0, triangle present 1, blue 0
    ("a red circle and a blue triangle", (Shape("circle", "blue", 0.25, 0.3, 0.12), Shape("triangle", "red", 0.7, 0.6, 0.12)), 0.5),
    # position the wrong way round: four object checks 1, relation 0: 4 / 5
    ("a blue square to the left of a green triangle",
     (Shape("square", "blue", 0.75, 0.5, 0.12), Shape("triangle", "green", 0.25, 0.5, 0.12)), 0.8),
    # colors: a square, but red: present 1, yellow 0
    ("a yellow square", (Shape("square", "red", 0.5, 0.5, 0.15),), 0.5),
    # two objects, one missing: circle 1, triangle 0
    ("a circle and a triangle", (Shape("circle", "red", 0.5, 0.5, 0.15),), 0.5),
    ("a circle", (Shape("square", "red", 0.5, 0.5, 0.15),), 0.0),
    ("a circle", (Shape("circle", "green", 0.5, 0.5, 0.15), Shape("square", "red", 0.2, 0.2, 0.1)), 1.0),
]


@pytest.mark.parametrize("caption, shapes, expected", PARTIAL)
def test_partial_credit_by_hand(caption, shapes, expected):
    [partial] = score([caption], [Scene(shapes)], partial_credit=True)
    assert partial == pytest.approx(expected)
    assert score([caption], [Scene(shapes)]) == [1.0 if expected == 1.0 else 0.0]


# --- what to check: the prompt or the metadata ----------------------------------------------
def test_the_metadata_spec_wins_over_the_prompt():
    pair = sample_pair(8, "position")
    spec = pair.spec.to_dict()
    assert score(["not a caption at all"], [pair.scene], metadata=[{"geneval": spec}]) == [1.0]
    assert score(["not a caption at all"], [pair.scene], metadata=[{"geneval": pair.spec}]) == [1.0]
    contradicted = mismatch(pair.spec, pair.scene)
    assert score([pair.caption], [pair.scene], metadata=[{"geneval": contradicted.to_dict()}]) == [0.0]


def test_a_caption_outside_the_grammar_fails_the_batch_naming_it():
    manager = RewardManager([RewardSpec("geneval_shapes")])
    images = torch.from_numpy(render(sample_pair(0).scene))[None]
    with pytest.raises(RewardError, match="caption 'a photo of a dog'"):
        manager.score(images, ["a photo of a dog"], [{}])


def test_per_task_metrics_and_pil_images():
    pairs = [sample_pair(1, "counting"), sample_pair(2, "counting"), sample_pair(3, "position"), sample_pair(4, "colors")]
    captions = [pairs[0].caption, caption_of(mismatch(pairs[1].spec, pairs[1].scene)), pairs[2].caption, pairs[3].caption]
    images = [Image.fromarray(render(p.scene, 48)) for p in pairs]
    out = RewardManager([RewardSpec("geneval_shapes")]).score(images, captions, [{} for _ in pairs])
    assert out.per_reward["geneval_shapes"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert {k: v for k, v in out.metrics.items() if k.startswith("reward/geneval/")} == {
        "reward/geneval/counting": 0.5, "reward/geneval/position": 1.0, "reward/geneval/colors": 1.0,
    }


def test_options_are_checked_at_load():
    assert reward_modalities("geneval_shapes") == {"image"}
    check_reward_options("geneval_shapes", {"partial_credit": True, "colour_threshold": 60.0})
    for options, named in [({"partial_credit": "yes"}, "partial_credit='yes'"), ({"colour_threshold": 0}, "colour_threshold=0"),
                           ({"min_area": 0.5}, "min_area=0.5"), ({"position_margin": -1}, "position_margin=-1"),
                           ({"partial": True}, "'partial'")]:
        with pytest.raises(RewardConfigError, match=named):
            check_reward_options("geneval_shapes", options)


def test_every_sampled_caption_is_one_the_reward_reads():
    for seed in range(60):
        pair = sample_pair(seed)
        assert parse_caption(pair.caption) == pair.spec


def test_check_item_wants_a_caption_of_the_grammar_or_its_spec():
    from demos.shapes.reward import check_spec_item

    assert check_spec_item("a photo of a red circle", {}) is None
    # With a spec in the metadata the spec is read, not the prompt; a bad spec is the reason.
    spec = {"task": "colors", "objects": [{"shape": "circle", "count": 1, "colour": "red"}], "relation": None}
    assert check_spec_item("anything", {"geneval": spec}) is None
    assert check_spec_item("a photo of a red circle", {"geneval": {"objects": 3}}).startswith("has no scene to check: geneval spec")
    reason = check_spec_item("a photo of a bench", {})
    assert reason.startswith("has no scene to check: caption 'a photo of a bench'")
