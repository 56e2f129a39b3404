"""Validation records and `val_rise`: the paired z and the per-group means, hand-computed."""
import math

import pytest

from omni_rl.logging import read_val_records, val_rise, write_val_records


def _rows(rewards, groups):
    return [
        {"prompt": f"p{i // 2}", "seed": i, "reward": r, "scores": {"g": r}, "groups": {"g": grp}}
        for i, (r, grp) in enumerate(zip(rewards, groups))
    ]


def test_val_rise_pairs_by_prompt_and_seed(tmp_path):
    samples = tmp_path / "samples"
    groups = ["a", "a", "b", "b"]
    write_val_records(samples / "val_step_000000.jsonl", _rows([0, 0, 1, 0], groups))
    write_val_records(samples / "val_step_000010.jsonl", _rows([1, 1, 0, 0], groups))  # not the last
    last = _rows([1, 1, 1, 1], groups)
    write_val_records(samples / "val_step_000020.jsonl", list(reversed(last)))  # order does not matter
    assert read_val_records(samples / "val_step_000000.jsonl")[2]["reward"] == 1
    out = val_rise(tmp_path)
    # d = [1, 1, 0, 1]: mean 0.75, std (ddof 1) = 0.5, se = 0.25, z = 3
    assert out["n"] == 4 and out["last_file"] == "val_step_000020.jsonl"
    assert out["rise"] == pytest.approx(0.75) and out["se"] == pytest.approx(0.25) and out["z"] == pytest.approx(3.0)
    assert out["groups"] == {"a": {"first_mean": 0.0, "last_mean": 1.0, "n": 2},
                             "b": {"first_mean": 0.5, "last_mean": 1.0, "n": 2}}


def test_val_rise_needs_two_files_with_shared_pairs(tmp_path):
    with pytest.raises(ValueError, match="0 validation record file"):
        val_rise(tmp_path)
    write_val_records(tmp_path / "samples" / "val_step_000000.jsonl", _rows([0, 1], ["a", "a"]))
    write_val_records(tmp_path / "samples" / "val_step_000005.jsonl", _rows([0, 1], ["a", "a"]))
    assert val_rise(tmp_path)["z"] == 0.0  # no change at all
    write_val_records(tmp_path / "samples" / "val_step_000009.jsonl", [{"prompt": "other", "seed": 0, "reward": 1}])
    with pytest.raises(ValueError, match="share 0"):
        val_rise(tmp_path)


def test_a_uniform_rise_has_infinite_z(tmp_path):
    write_val_records(tmp_path / "samples" / "val_step_000000.jsonl", _rows([0, 0], ["a", "a"]))
    write_val_records(tmp_path / "samples" / "val_step_000001.jsonl", _rows([1, 1], ["a", "a"]))
    assert val_rise(tmp_path)["z"] == math.inf
