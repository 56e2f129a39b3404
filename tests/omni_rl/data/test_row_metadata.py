"""A plain `.jsonl` row's fields beside its prompt reach the rewards' metadata (omni_rl/data/row_metadata.py,
read by omni_rl/data/prompts.py): the field's real GenEval files, Flow-Factory's sudoku rows, and a clash."""
from __future__ import annotations

import json

import pytest

from omni_rl.data.prompts import PromptFileError, read_prompt_file
from tests.shared_data import shared_dataset


@pytest.mark.parametrize("relative, rows", [
    ("geneval/evaluation_metadata.jsonl", 553),             # the official GenEval prompts
    ("flow_grpo/geneval/test_metadata.jsonl", 2212),        # Flow-GRPO's test set: 4 rows each
])
def test_every_geneval_row_keeps_its_clauses(relative, rows):
    path = shared_dataset(relative)
    expected = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    items = read_prompt_file(str(path))
    assert len(items) == len(expected) == rows
    for n, (item, row) in enumerate(zip(items, expected), start=1):
        assert item.prompt == row["prompt"]
        # Every field beside the prompt, as the file has it: the tag and the include clauses on
        # every row, the exclude clauses where the row gives them (counting rows do).
        assert item.metadata == {key: value for key, value in row.items() if key != "prompt"}
        assert item.metadata["tag"] == row["tag"] and item.metadata["include"] == row["include"]
        assert item.metadata.get("exclude") == row.get("exclude")
        assert item.origin == f"line {n}"
    assert sum("exclude" in item.metadata for item in items) > 0  # the counting rows carry one


def test_sudoku_rows_keep_puzzle_and_solution_beside_a_metadata_object(tmp_path):
    # Flow-Factory's sudoku rows: the puzzle and its solution beside the prompt.
    path = tmp_path / "sudoku.jsonl"
    path.write_text(json.dumps({"prompt": "solve", "puzzle": "53..7....", "solution": "534678912",
                                "metadata": {"level": 2}}) + "\n\n"
                    + json.dumps({"prompt": "again", "puzzle": None}) + "\n", encoding="utf-8")
    first, second = read_prompt_file(str(path))
    assert first.metadata == {"level": 2, "puzzle": "53..7....", "solution": "534678912"}
    assert second.metadata == {} and second.origin == "line 3"  # a null field counts as absent


def test_a_field_given_twice_with_two_values_is_refused_with_its_line(tmp_path):
    path = tmp_path / "clash.jsonl"
    path.write_text(json.dumps({"prompt": "a", "text": "A", "metadata": {"text": "A"}}) + "\n"  # equal: kept once
                    + json.dumps({"prompt": "b", "text": "B", "metadata": {"text": "C"}}) + "\n", encoding="utf-8")
    with pytest.raises(PromptFileError, match=rf"^{path}:2: field 'text' is 'B' but metadata.text is 'C'; .* give 'text' once"):
        read_prompt_file(str(path))
    path.write_text(json.dumps({"prompt": "a", "text": "A", "metadata": {"text": "A"}}) + "\n", encoding="utf-8")
    assert read_prompt_file(str(path))[0].metadata == {"text": "A"}
