"""omni_rl/eval/geneval_prompts.py: GenEval-style training rows, none of them an official test prompt."""
import json
from collections import Counter

import numpy as np
import pytest

from omni_rl.eval.geneval_prompts import distinct_prompts, draw_row, generate_rows, main, read_prompts
from omni_rl.eval.geneval_rules import GENEVAL_TASKS, parse_row, verdict
from tests.shared_data import shared_dataset


def test_rules_write_rows_as_genevals_generator_does():
    rng = np.random.default_rng(0)
    for _ in range(50):
        row = draw_row("counting", rng)
        n = row["include"][0]["count"]
        assert 2 <= n <= 4 and row["exclude"] == [{"class": row["include"][0]["class"], "count": n + 1}]
        row = draw_row("position", rng)
        target, subject = row["include"]
        relation = subject["position"][0]
        # "a photo of {a} A {relation} {a} B": the subject A is named first, its target B listed first.
        assert row["prompt"].endswith(f"{relation} {'an' if target['class'][0] in 'aeiou' else 'a'} {target['class']}")
        row = draw_row("color_attr", rng)
        a, b = row["include"]
        assert a["class"] != b["class"] and a["color"] != b["color"] and "person" not in (a["class"], b["class"])
    # Articles and plurals by GenEval's letters: "an apple", "two buses".
    assert any(draw_row("single_object", np.random.default_rng(s))["prompt"] == "a photo of an apple" for s in range(400))
    assert distinct_prompts("single_object") == 80 and distinct_prompts("counting") == 240


def test_no_generated_prompt_is_an_official_test_prompt_and_every_row_parses():
    official = read_prompts(shared_dataset("geneval/evaluation_metadata.jsonl"))
    assert len(official) == 553
    # All 80 single_object prompts are official test prompts, so that task is weighted 0.
    weights = {t: float(t != "single_object") for t in GENEVAL_TASKS}
    rows = generate_rows(3000, seed=7, weights=weights, exclude_prompts=official)
    assert not {r["prompt"] for r in rows} & official
    for i, row in enumerate(rows):
        parse_row(row, where=f"generated row {i}")
        assert not verdict({}, row).correct  # every row asks for something
    # The five tasks drawn about uniformly (600 each expected, sd 22; 6 sd is about 130).
    counts = Counter(r["tag"] for r in rows)
    assert set(counts) == set(GENEVAL_TASKS) - {"single_object"} and all(470 < c < 730 for c in counts.values())
    # Left in, single_object can draw no prompt that is not a test prompt: an error naming it, not a
    # silent copy of the test set.
    with pytest.raises(ValueError, match="no new single_object prompt"):
        generate_rows(5, exclude_prompts=official)


def test_seed_weights_and_unique():
    assert generate_rows(50, seed=3) == generate_rows(50, seed=3)
    assert generate_rows(50, seed=3) != generate_rows(50, seed=4)
    rows = generate_rows(200, seed=1, weights={"counting": 3, "position": 1})
    counts = Counter(r["tag"] for r in rows)
    assert set(counts) == {"counting", "position"} and counts["counting"] > counts["position"]
    # 200 of counting's 240 prompts, each once (drawing by rejection; the last ones take many draws).
    unique = generate_rows(200, seed=0, weights={"counting": 1}, unique=True)
    assert len({r["prompt"] for r in unique}) == 200
    with pytest.raises(ValueError, match="at most 240"):
        generate_rows(241, weights={"counting": 1}, unique=True)
    with pytest.raises(ValueError, match="tasks \\['count'\\]"):
        generate_rows(5, weights={"count": 1})


def test_command_writes_jsonl(tmp_path):
    out = tmp_path / "train.jsonl"
    official = shared_dataset("geneval/evaluation_metadata.jsonl")
    main(["--n", "20", "--seed", "2", "--exclude", str(official), "--no-single-object", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    weights = {t: float(t != "single_object") for t in GENEVAL_TASKS}
    assert rows == generate_rows(20, seed=2, weights=weights, exclude_prompts=read_prompts(official))
