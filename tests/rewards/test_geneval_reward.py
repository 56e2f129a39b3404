"""rewards/geneval.py end to end on a CPU: the tiny Mask2Former (`tiny:mask2former-coco`) and the tiny
CLIP (`tiny:clip-reward`), built from configs with the real transformers classes, saved with
save_pretrained and loaded back through the reward's own loading code.

Their weights are random, so their verdicts are meaningless: these tests check the plumbing (one
verdict per image, its details, the groups, the detector's masks and boxes, the colour stage) and
the colour crop on a hand-made image, not what the real models would say.
"""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.eval.geneval_rules import COLOURS, DetectedObject, kept_objects, needs_colour
from omni_rl.reward import RewardInputError, RewardScores, build_reward
from omni_rl.reward.registry import check_reward_options
from omni_rl.eval.geneval_rules import COCO_CLASSES
from rewards.geneval_detector import colour_crop, mask_box

TINY = dict(model="tiny:mask2former-coco", clip_model="tiny:clip-reward", device="cpu")
ROWS = [
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}]},
    {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]},
    {"tag": "color_attr", "include": [{"class": "dog", "count": 1, "color": "red"},
                                      {"class": "cat", "count": 1, "color": "blue"}]},
    {"tag": "position", "include": [{"class": "car", "count": 1},
                                    {"class": "bus", "count": 1, "position": ["left of", 0]}]},
]
PROMPTS = ["a photo of a bench", "a photo of two cups", "a photo of a red dog and a blue cat",
           "a photo of a bus left of a car"]


def _images(n=4, seed=0, size=(48, 40)):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (n, size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def scorer():
    return build_reward("geneval", **TINY)


def test_one_verdict_per_image_with_details_and_groups(scorer):
    out = scorer(_images(), PROMPTS, ROWS)
    assert isinstance(out, RewardScores) and len(out.scores) == 4 and all(isinstance(s, float) for s in out.scores)
    assert out.groups == ["geneval_task/single_object", "geneval_task/counting", "geneval_task/color_attr",
                          "geneval_task/position"]
    for value, d in zip(out.scores, out.details):
        assert set(d) == {"correct", "strict_correct", "score", "reason", "strict_reason"}
        assert isinstance(d["correct"], bool) and isinstance(d["strict_correct"], bool)
        assert isinstance(d["reason"], str) and isinstance(d["strict_reason"], str)
        assert value == d["score"]  # score="partial" is the default
        # A verdict without a reason is a correct one, and the other way round.
        assert (d["reason"] == "") == d["correct"]


def test_score_option_picks_the_reading(scorer):
    images = _images(seed=1)
    details = scorer(images, PROMPTS, ROWS).details
    strict = build_reward("geneval", score="strict", **TINY)(images, PROMPTS, ROWS)
    correct = build_reward("geneval", score="correct", **TINY)(images, PROMPTS, ROWS)
    assert strict.scores == [float(d["strict_correct"]) for d in details]
    assert correct.scores == [float(d["correct"]) for d in details]


def test_detector_masks_boxes_and_colours_at_threshold_zero():
    # Random weights score every instance near 1/81; with the thresholds at 0 every instance is kept,
    # so the colour stage runs on real crops of the detector's masks.
    low = build_reward("geneval", threshold=0.0, counting_threshold=0.0, **TINY)
    images = _images(n=2, seed=2)
    pils = [Image.fromarray(a) for a in images.numpy()]
    found = low.detector(pils)
    assert len(found) == 2 and found[0], "the tiny detector kept no instance at min_score 0"
    for o in found[0]:
        assert o.name in COCO_CLASSES and 0 < o.score < 1 and o.mask.shape == (40, 48) and o.mask.any()
        assert o.box == mask_box(o.mask)
    name = found[0][0].name
    row = {"tag": "colors", "include": [{"class": name, "count": 1, "color": "red"}]}
    kept = kept_objects(found[0], row, low.rules)
    assert needs_colour(kept, row) == [(name, 0)]
    [colour] = low.colours(pils[0], kept[name][:1], name)
    assert colour in COLOURS
    # The reward's verdict on that image reads the colour the classifier gave.
    [d] = low(images[:1], ["x"], [row]).details
    assert d["correct"] == (colour == "red")


def test_class_embeddings_are_the_normalised_mean_of_the_templates(scorer):
    clip = scorer.colours.clip
    table = scorer.colours.class_embeddings("dog")
    assert table.shape == (10, clip.dim)
    texts = clip.texts(["a photo of a green dog", "a photo of a green-colored dog", "a photo of a green object"])
    expected = torch.nn.functional.normalize(texts.mean(dim=0), dim=-1)
    assert torch.allclose(table[COLOURS.index("green")], expected, atol=1e-6)
    assert torch.allclose(table.norm(dim=-1), torch.ones(10), atol=1e-5)


def test_colour_crop_composites_over_999_and_crops_to_the_box():
    # An 8x6 image of pure red; the object's mask is the 3x2 block at x 2..4, y 1..2, minus its
    # corner (4, 2). Its box is (2, 1, 5, 3): a 3x2 crop whose corner pixel falls outside the mask.
    image = Image.new("RGB", (8, 6), (255, 0, 0))
    mask = np.zeros((6, 8), bool)
    mask[1:3, 2:5] = True
    mask[2, 4] = False
    box = mask_box(mask)
    assert box == (2.0, 1.0, 5.0, 3.0)
    crop = np.asarray(colour_crop(image, box, mask))
    assert crop.shape == (2, 3, 3)
    assert (crop[mask[1:3, 2:5]] == (255, 0, 0)).all()
    assert tuple(crop[1, 2]) == (153, 153, 153)  # #999 outside the mask
    # No mask: the bare crop.
    assert (np.asarray(colour_crop(image, box, None)) == (255, 0, 0)).all()
    with pytest.raises(ValueError, match="mask of shape"):
        colour_crop(image, box, mask[:5])


def test_rows_missing_clauses_or_classes_are_errors_naming_the_sample(scorer):
    with pytest.raises(RewardInputError, match="sample 1 .*no 'include'"):
        scorer(_images(n=2), ["a", "b"], [ROWS[0], {"tag": "counting"}])
    with pytest.raises(RewardInputError, match=r"sample 0 .*\['unicorn'\]"):
        scorer(_images(n=1), ["a"], [{"tag": "single_object", "include": [{"class": "unicorn", "count": 1}]}])
    with pytest.raises(ValueError, match="score='lenient'"):
        check_reward_options("geneval", {"score": "lenient"})
    with pytest.raises(ValueError, match="counting_threshold=2"):
        check_reward_options("geneval", {"counting_threshold": 2})


def test_detector_refuses_a_model_without_cocos_classes(tmp_path):
    from rewards.geneval_detector import Mask2FormerDetector
    from rewards.tiny_models import build_tiny_mask2former
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation

    build_tiny_mask2former(tmp_path)  # its image processor stays; the network is replaced by a 3-class one
    config = Mask2FormerConfig.from_pretrained(tmp_path)
    config.num_labels, config.id2label, config.label2id = 3, {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1, "c": 2}
    Mask2FormerForUniversalSegmentation(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="predicts 3 classes"):
        Mask2FormerDetector(str(tmp_path), None, "cpu", "geneval", 0.3)
