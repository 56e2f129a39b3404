"""rewards/ocr.py: the edit distance by hand, target parsing, and RapidOCR on rendered text."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from omni_rl.reward import build_reward
from rewards.ocr import levenshtein, ocr_score, ocr_target

_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def _render(text, size=(512, 128)):
    """Large black text on white, as a uint8 [H, W, 3] array."""
    font = ImageFont.truetype(str(_FONT), 64) if _FONT.exists() else ImageFont.load_default(size=48)
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((20, 25), text, font=font, fill="black")
    return np.asarray(image)


@pytest.mark.parametrize("a, b, expected", [
    ("", "", 0), ("abc", "", 3), ("", "ab", 2), ("kitten", "sitting", 3),  # k->s, e->i, +g
    ("flaw", "lawn", 2), ("same", "same", 0), ("ab", "ba", 2),
])
def test_levenshtein_by_hand(a, b, expected):
    assert levenshtein(a, b) == expected
    assert levenshtein(b, a) == expected


def test_score_formula_edit_distance_rule():
    # The rule this reward had before Flow-GRPO's, kept as rule="edit_distance".
    score = lambda recognised, target: ocr_score(recognised, target, "edit_distance")  # noqa: E731
    assert score("Hello World", "hello world") == 1.0  # case and spaces ignored
    assert score("HELLOWORLD", "Hello World") == 1.0
    assert score("helloworld!", "helloworld") == pytest.approx(0.9)  # 1 insertion / 10
    assert score("Hello\nWorld", "Hello World") == 1.0  # all whitespace removed
    assert score("", "abc") == 0.0
    assert score("a much longer unrelated text", "abc") == 0.0  # distance capped at len(target)
    # "saletodayonly" against "sale": 9 deletions, capped at 4 -> 1 - 4/4.
    assert score("SALE TODAY ONLY", "Sale") == 0.0


def test_score_formula_flow_grpo_rule_by_hand():
    # Flow-GRPO's rule (flow_grpo/ocr.py), the default: lower-case, spaces removed, a target
    # inside the recognised text scores 1, else 1 - min(levenshtein, len(target)) / len(target).
    assert ocr_score("SALE TODAY ONLY", "Sale") == 1.0  # "sale" in "saletodayonly": the target beside other text
    assert ocr_score("OPEN 24 HOURS", "24 hours") == 1.0  # "24hours" in "open24hours"
    assert ocr_score("helloworld!", "helloworld") == 1.0  # extra text costs nothing
    assert ocr_score("Helo World", "hello world") == pytest.approx(0.9)  # "heloworld": 1 insertion / 10
    # Only the space character is removed: the newline stays and costs 1 edit of 10.
    assert ocr_score("Hello\nWorld", "Hello World") == pytest.approx(0.9)
    assert ocr_score("", "abc") == 0.0
    assert ocr_score("a much longer unrelated text", "abc") == 0.0  # no "abc" in it; distance capped at 3
    assert ocr_score("ab", "abcd") == pytest.approx(0.5)  # 2 insertions / 4
    with pytest.raises(ValueError, match="rule='fuzzy'; expected one of"):
        ocr_score("a", "a", "fuzzy")


def test_target_from_quotes_or_metadata():
    assert ocr_target('a sign that says "Hello World"', {}, 0) == "Hello World"
    assert ocr_target("a mug printed with \u201cOMNI\u201d", {}, 0) == "OMNI"
    assert ocr_target('says "one" and "two"', {}, 0) == "one"
    assert ocr_target('a sign that says "Hello"', {"text": "Bye"}, 0) == "Bye"  # metadata wins
    with pytest.raises(ValueError, match="sample 3 has no target text"):
        ocr_target("a sign with no quotes", {}, 3)
    with pytest.raises(ValueError, match="sample 1.*empty"):
        ocr_target('a sign that says "  "', {}, 1)
    with pytest.raises(ValueError, match=r"sample 2 has metadata\['text'\] of type int"):
        ocr_target("x", {"text": 5}, 2)


def test_rendered_text_scores_high_wrong_text_low_blank_zero():
    images = torch.from_numpy(np.stack([
        _render("Hello World"), _render("Goodbye Moon"), np.full((128, 512, 3), 255, np.uint8),
        _render("OMNI RL"),
    ]))
    prompts = ['a sign that says "Hello World"', 'a sign that says "Hello World"', 'a sign that says "Hello"', "x"]
    metadata = [{}, {}, {}, {"text": "omni rl"}]
    scorer = build_reward("ocr")
    scores = scorer(images, prompts, metadata)
    assert all(isinstance(s, float) for s in scores)
    assert scores[0] >= 0.9, scores
    assert scores[1] < 0.5, scores
    assert scores[2] == 0.0, scores
    assert scores[3] >= 0.9, scores
    one_by_one = [scorer(images[i:i + 1], prompts[i:i + 1], metadata[i:i + 1])[0] for i in range(4)]
    assert one_by_one == pytest.approx(scores, abs=1e-5)
    pils = [Image.fromarray(a) for a in images.numpy()]
    assert scorer(pils, prompts, metadata) == scores


def test_missing_target_fails_before_ocr_and_names_the_sample():
    scorer = build_reward("ocr")
    blank = torch.full((2, 64, 64, 3), 255, dtype=torch.uint8)
    with pytest.raises(ValueError, match="sample 1 has no target text"):
        scorer(blank, ['says "a"', "no quotes here"], [{}, {}])


def test_target_beside_other_text_in_an_image_scores_one_under_flow_grpo():
    images = torch.from_numpy(np.stack([_render("SALE TODAY")]))
    prompts = ['a shop window with a sign that says "SALE"']
    assert build_reward("ocr")(images, prompts, [{}]) == [1.0]
    # The old rule charges the extra text: 5 or more edits, capped at the target's 4 characters.
    assert build_reward("ocr", rule="edit_distance")(images, prompts, [{}])[0] <= 0.25


def test_which_boxes_count_under_each_rule():
    flow_grpo, old, floor = build_reward("ocr"), build_reward("ocr", rule="edit_distance"), build_reward("ocr", min_confidence=0.3)
    assert (flow_grpo.counts(0.0), flow_grpo.counts(0.01)) == (False, True)  # Flow-GRPO keeps score > 0
    assert (old.counts(0.49), old.counts(0.5)) == (False, True)  # RapidOCR's own 0.5
    assert (floor.counts(0.29), floor.counts(0.3)) == (False, True)


def test_check_item_says_why_a_prompt_has_no_target():
    from rewards.ocr import check_ocr_item

    assert check_ocr_item('a sign that says "OPEN"', {}) is None
    assert check_ocr_item("no quotes", {"text": "OPEN"}) is None
    assert check_ocr_item("Beautiful woman in the gym", {}).startswith("has no target text: its prompt 'Beautiful woman")
    assert check_ocr_item('says "  "', {}).startswith("has an empty target")


@pytest.mark.parametrize("kwargs, pattern", [
    ({"min_confidence": 1.5}, "min_confidence=1.5"),
    ({"rule": "fuzzy"}, r"rule='fuzzy'; expected one of \['flow_grpo', 'edit_distance'\]"),
    ({"det_limit_side_len": 8}, "det_limit_side_len=8"),
    ({"use_angle_cls": "yes"}, "use_angle_cls='yes'"),
])
def test_bad_options(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_reward("ocr", **kwargs)
