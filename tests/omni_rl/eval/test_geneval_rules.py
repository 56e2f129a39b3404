"""GenEval's rules on hand-worked detections: each case works its verdict out in a comment."""
from __future__ import annotations

import json

import numpy as np
import pytest

from omni_rl.eval.geneval_rules import (
    COCO_CLASSES,
    COLOURS,
    GENEVAL_TASKS,
    DetectedObject,
    GenEvalProtocol,
    kept_objects,
    needs_colour,
    parse_row,
    relative_position,
    summary_scores,
    verdict,
)
from tests.shared_data import shared_dataset


def obj(name, score=0.99, box=(0, 0, 10, 10), colour=None):
    return DetectedObject(name, score, box, colour=colour)


def judge(detections, row, rules=GenEvalProtocol()):
    kept = kept_objects(detections, row, rules)
    return kept, verdict(kept, row, rules)


def test_protocol_pins_genevals_constants():
    rules = GenEvalProtocol()
    assert (rules.threshold, rules.counting_threshold, rules.max_objects, rules.max_overlap,
            rules.position_threshold) == (0.3, 0.9, 16, 1.0, 0.1)
    assert rules.colours == ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
    assert GENEVAL_TASKS == ("single_object", "two_object", "counting", "colors", "position", "color_attr")
    with pytest.raises(ValueError, match="threshold=1.5"):
        GenEvalProtocol(threshold=1.5)


def test_single_object_threshold_is_strictly_above_0_3():
    row = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
    # A bench at 0.3 is not above 0.3: none kept -> "at least 1, found 0"; Flow-GRPO: 1 - |1 - 0| / 1 = 0.
    kept, v = judge([obj("bench", 0.3)], row)
    assert kept == {} and not v.correct and not v.strict_correct and v.score == 0.0
    assert "bench: expected at least 1, found 0" in v.reason
    # At 0.31 it is kept: correct both ways, score 1.
    _, v = judge([obj("bench", 0.31)], row)
    assert v.correct and v.strict_correct and v.score == 1.0 and v.reason == ""


def test_counting_at_0_9_with_the_exclude_clause():
    row = {"tag": "counting", "include": [{"class": "dog", "count": 3}], "exclude": [{"class": "dog", "count": 4}],
           "prompt": "a photo of three dogs"}
    # Three dogs at 0.95 and one at 0.85: counting keeps scores above 0.9, so the 0.85 dog is dropped.
    # Kept 3 >= 3 (include holds) and 3 < 4 (exclude not reached) -> correct; exactly 3 -> strict, score 1.
    dogs = [obj("dog", 0.95, (i * 20, 0, i * 20 + 10, 10)) for i in range(3)] + [obj("dog", 0.85)]
    kept, v = judge(dogs, row)
    assert len(kept["dog"]) == 3 and v.correct and v.strict_correct and v.score == 1.0
    # The same dogs on a non-counting row (threshold 0.3) would keep all four.
    assert len(kept_objects(dogs, {**row, "tag": "two_object"})["dog"]) == 4
    # Four dogs above 0.9: include holds (4 >= 3) but the exclude clause is hit (4 >= 4) -> incorrect.
    # Flow-GRPO: exact count fails, score 1 - |3 - 4| / 3 = 2/3.
    _, v = judge(dogs[:3] + [obj("dog", 0.92)], row)
    assert not v.correct and "dog: expected fewer than 4, found 4" in v.reason
    assert not v.strict_correct and v.score == pytest.approx(2 / 3)


def test_a_clause_fails_for_too_few_objects():
    row = {"tag": "counting", "include": [{"class": "cup", "count": 4}], "exclude": [{"class": "cup", "count": 5}]}
    # Two cups above 0.9: 2 < 4 -> incorrect; Flow-GRPO: 1 - |4 - 2| / 4 = 0.5.
    _, v = judge([obj("cup", 0.97), obj("cup", 0.93)], row)
    assert not v.correct and v.reason == "cup: expected at least 4, found 2"
    assert not v.strict_correct and v.score == 0.5


def test_two_object_needs_both_classes():
    row = {"tag": "two_object", "include": [{"class": "bench", "count": 1}, {"class": "sports ball", "count": 1}]}
    # A bench and two sports balls: GenEval reads "at least 1" -> correct. Flow-GRPO: bench term 1,
    # ball term 1 - |1 - 2| / 1 = 0 -> score 0.5, not strict.
    _, v = judge([obj("bench"), obj("sports ball"), obj("sports ball", 0.5)], row)
    assert v.correct and not v.strict_correct and v.score == 0.5
    # No sports ball: incorrect, score (1 + 0) / 2.
    _, v = judge([obj("bench")], row)
    assert not v.correct and "sports ball: expected at least 1, found 0" in v.reason and v.score == 0.5


def test_colour_decided_on_the_detection_and_only_the_first_count_read():
    row = {"tag": "colors", "include": [{"class": "fire hydrant", "count": 1, "color": "blue"}]}
    hydrants = [obj("fire hydrant", 0.9, colour="blue"), obj("fire hydrant", 0.8)]
    kept = kept_objects(hydrants, row)
    # Only the most confident hydrant's colour is read (the first count = 1 of the class).
    assert needs_colour(kept, row) == [("fire hydrant", 0)]
    # It is blue -> correct. Flow-GRPO: two hydrants where one was asked for: count term 0, colour 0
    # (count not exact) -> score 0.
    v = verdict(kept, row)
    assert v.correct and not v.strict_correct and v.score == 0.0
    # A red one alone: GenEval fails the colour; Flow-GRPO: count 1, colour 1 - |1 - 0| / 1 = 0 -> 0.5.
    kept = kept_objects([obj("fire hydrant", colour="red")], row)
    v = verdict(kept, row)
    assert not v.correct and "expected 1 blue, found 1 red" in v.reason and v.score == 0.5
    # A needed colour that no classifier set is an error naming the object.
    with pytest.raises(ValueError, match="colour of fire hydrant #0"):
        verdict(kept_objects([obj("fire hydrant")], row), row)


def test_color_attr_binds_each_colour_to_its_class():
    row = {"tag": "color_attr", "include": [{"class": "wine glass", "count": 1, "color": "purple"},
                                            {"class": "apple", "count": 1, "color": "black"}]}
    # Purple glass, black apple: both clauses hold -> correct, score (1 + 1 + 1 + 1) / 4 = 1.
    _, v = judge([obj("wine glass", colour="purple"), obj("apple", colour="black")], row)
    assert v.correct and v.strict_correct and v.score == 1.0
    # Colours swapped: both colour clauses fail -> terms (1, 0, 1, 0) -> 0.5.
    _, v = judge([obj("wine glass", colour="black"), obj("apple", colour="purple")], row)
    assert not v.correct and not v.strict_correct and v.score == 0.5


# Position: B is a 10x10 box at the origin, A a 10x10 box moved by (dx, dy). The margin is
# 0.1 * (10 + 10) = 2 pixels on each axis, so a shift of 2 or less gives no relation on that axis.
B = (0, 0, 10, 10)


def shifted(dx, dy):
    return (dx, dy, 10 + dx, 10 + dy)


@pytest.mark.parametrize("relation, inside, outside", [
    # A pure shift s along the axis: revised / ||offset|| = (s - 2) / s, above 0.5 once s > 4.
    ("right of", (4.5, 0), (4.0, 0)),   # (4.5 - 2) / 4.5 = 0.556 > 0.5; (4 - 2) / 4 = 0.5, not > 0.5
    ("left of", (-4.5, 0), (-4.0, 0)),
    ("below", (0, 4.5), (0, 4.0)),      # y grows downwards
    ("above", (0, -4.5), (0, -4.0)),
])
def test_each_relation_with_the_margin(relation, inside, outside):
    assert relative_position(shifted(*inside), B) == {relation}
    assert relative_position(shifted(*outside), B) == set()
    # Within the margin itself (a 2 px shift) every axis is absorbed: no relation at all.
    assert relative_position(shifted(inside[0] * 2 / 4.5, inside[1] * 2 / 4.5), B) == set()


def test_diagonal_gives_two_relations_and_a_steep_one_gives_one():
    # (10, 10): revised (8, 8) / ||(10, 10)|| = 0.566 each -> right of and below.
    assert relative_position(shifted(10, 10), B) == {"right of", "below"}
    # (3, 10): revised (1, 8) / 10.44 = (0.096, 0.766) -> below only.
    assert relative_position(shifted(3, 10), B) == {"below"}


def test_position_row_with_the_target_and_partial_credit():
    row = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                          {"class": "dog", "count": 1, "position": ["right of", 0]}],
           "prompt": "a photo of a dog right of a teddy bear"}
    bear = obj("teddy bear", box=B)
    # Dog 20 px to the right: (20 - 2) / 20 = 0.9 > 0.5 -> right of -> correct, score (1 + 1 + 1) / 3 = 1.
    _, v = judge([bear, obj("dog", box=shifted(20, 0))], row)
    assert v.correct and v.strict_correct and v.score == 1.0
    # Dog to the left: the pair fails. GenEval: incorrect. Flow-GRPO's terms: bear 1; dog count 1,
    # position 0 and then its trailing 1 -> (1 + 1 + 0 + 1) / 4 = 0.75.
    _, v = judge([bear, obj("dog", box=shifted(-20, 0))], row)
    assert not v.correct and "dog: expected right of the target, found left of" in v.reason
    assert not v.strict_correct and v.score == 0.75
    # No bear: no target. Terms: bear 0; dog count 1, position 0 -> (0 + 1 + 0) / 3 = 1/3.
    _, v = judge([obj("dog", box=shifted(20, 0))], row)
    assert not v.correct and "no target" in v.reason and v.score == pytest.approx(1 / 3)


def test_flow_grpo_partial_score_worked_by_hand():
    # color_attr row, a red car and a white bus asked. Detections: two cars (one red, one blue), one white bus.
    row = {"tag": "color_attr", "include": [{"class": "car", "count": 1, "color": "red"},
                                            {"class": "bus", "count": 1, "color": "white"}]}
    kept = kept_objects([obj("car", 0.8, colour="red"), obj("car", 0.7, colour="blue"),
                         obj("bus", 0.6, colour="white")], row)
    # GenEval reads the most confident car (red) and the bus (white): correct.
    # Flow-GRPO: car count 1 - |1 - 2| / 1 = 0, count not exact so colour term 0; bus count 1, colour 1.
    # Score (0 + 0 + 1 + 1) / 4 = 0.5; strict fails on the car.
    assert needs_colour(kept, row) == [("car", 0), ("bus", 0)]
    v = verdict(kept, row)
    assert v.correct and not v.strict_correct and v.score == 0.5
    assert v.strict_reason == "car: expected exactly 1, found 2"
    # Four cars where one was asked: 1 - |1 - 4| / 1 = -2 (Flow-GRPO does not clip): (-2 + 0 + 1 + 1) / 4 = 0.
    kept = kept_objects([obj("car", colour="red")] * 4 + [obj("bus", colour="white")], row)
    assert verdict(kept, row).score == 0.0


def test_max_objects_ties_and_nms():
    row = {"tag": "single_object", "include": [{"class": "kite", "count": 1}]}
    kites = [obj("kite", 0.5 + i / 100, (i, 0, i + 10, 10)) for i in range(20)]
    kept = kept_objects(kites, row)["kite"]
    # 20 kites above 0.3: the 16 most confident, descending (0.69 down to 0.54).
    assert len(kept) == 16 and kept[0].score == pytest.approx(0.69) and kept[-1].score == pytest.approx(0.54)
    # Ties keep the detector's order.
    a, b = obj("kite", 0.5, (0, 0, 1, 1)), obj("kite", 0.5, (5, 5, 6, 6))
    assert kept_objects([a, b], row)["kite"] == [a, b]
    # NMS at 0.5: boxes (0,0,10,10) and (1,0,11,10): with GenEval's +1, intersection 10 * 11 = 110,
    # union 121 + 121 - 110 = 132 -> IoU 0.833 >= 0.5, so the second is dropped; off (1.0) keeps both.
    pair = [obj("kite", 0.9, (0, 0, 10, 10)), obj("kite", 0.8, (1, 0, 11, 10))]
    assert len(kept_objects(pair, row, GenEvalProtocol(max_overlap=0.5))["kite"]) == 1
    assert len(kept_objects(pair, row)["kite"]) == 2


def test_empty_include_and_bad_rows():
    # No clause at all: correct and strict-correct, score 0 (no terms).
    v = verdict({}, {"tag": "single_object", "include": []})
    assert v.correct and v.strict_correct and v.score == 0.0
    with pytest.raises(ValueError, match="tag 'counts'"):
        parse_row({"tag": "counts", "include": []})
    with pytest.raises(ValueError, match="no 'include'"):
        parse_row({"tag": "counting"}, where="sample 3")
    with pytest.raises(ValueError, match=r"include\[0\]\['count'\] = 0"):
        parse_row({"tag": "counting", "include": [{"class": "dog", "count": 0}]})
    with pytest.raises(ValueError, match=r"include\[0\]\['position'\]"):
        parse_row({"tag": "position", "include": [{"class": "dog", "count": 1, "position": ["left of", 0]}]})
    with pytest.raises(ValueError, match=r"\['color'\] = 'teal'"):
        parse_row({"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "teal"}]})


def test_summary_scores_mean_over_tasks_and_prompts():
    # Task a: 1 of 2 correct (0.5); task b: 1 of 1 (1.0) -> overall (0.5 + 1) / 2 = 0.75.
    # Images: 2 of 3 correct. Prompts: p1 (one of its two images correct) and p2 -> both correct.
    s = summary_scores(["counting", "counting", "position"], ["p1", "p1", "p2"], [True, False, True])
    assert s["tasks"] == {"counting": 0.5, "position": 1.0} and s["overall"] == 0.75
    assert s["correct_images"] == pytest.approx(2 / 3) and s["correct_prompts"] == 1.0


@pytest.mark.parametrize("relative, rows", [("geneval/evaluation_metadata.jsonl", 553),
                                            ("flow_grpo/geneval/test_metadata.jsonl", 2212)])
def test_every_real_row_parses_and_fails_on_no_detections(relative, rows):
    lines = shared_dataset(relative).read_text().splitlines()
    assert len(lines) == rows
    names = shared_dataset("geneval/object_names.txt").read_text().splitlines()
    # The detector's label list is GenEval's object list, in COCO's order.
    assert tuple(names) == COCO_CLASSES
    tags = set()
    for i, line in enumerate(lines):
        row = json.loads(line)
        parsed = parse_row(row, where=f"{relative} line {i + 1}")
        assert parsed.include and all(c.name in names for c in parsed.include + parsed.exclude)
        assert all(c.colour in COLOURS for c in parsed.include if c.colour)
        v = verdict({}, row)
        # Every row asks for at least one object, so nothing detected is never correct.
        assert not v.correct and not v.strict_correct and v.score == 0.0 and v.reason
        tags.add(parsed.tag)
    assert tags == set(GENEVAL_TASKS)


def test_mask_does_not_enter_the_rules():
    # The rules read boxes and colours; a mask rides along for the colour classifier only.
    row = {"tag": "single_object", "include": [{"class": "cat", "count": 1}]}
    with_mask = DetectedObject("cat", 0.9, (0, 0, 2, 2), mask=np.ones((2, 2), bool))
    assert verdict(kept_objects([with_mask], row), row).correct
