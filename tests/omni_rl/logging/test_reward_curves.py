"""Reward curve PNG and the rise test, on synthetic metrics.jsonl files."""
import math

import numpy as np
import pytest
from PIL import Image

from omni_rl.logging import JsonlSink, moving_average, plot_reward_curve, rise_report


def _write(path, values, key="reward/total/mean", val_every=None):
    sink = JsonlSink(path)
    for step, value in enumerate(values, start=1):
        metrics = {key: value}
        if val_every and step % val_every == 0:
            metrics["val/reward/total/mean"] = value + 0.1
        sink.log(metrics, step)
    sink.close()
    return path


def test_moving_average_is_trailing():
    # window 2: [1, (1+3)/2, (3+5)/2]
    assert moving_average(np.array([1.0, 3.0, 5.0]), 2).tolist() == [1.0, 2.0, 4.0]


def test_plot_reward_curve_writes_valid_png(tmp_path):
    path = _write(tmp_path / "run" / "metrics.jsonl", np.linspace(0, 1, 30).tolist(), val_every=10)
    out = plot_reward_curve(path, tmp_path / "plots" / "reward.png")
    with Image.open(out) as image:
        image.verify()
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width > 100
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["reward.png"]


def test_plot_reward_curve_missing_key_lists_found_metrics(tmp_path):
    path = _write(tmp_path / "metrics.jsonl", [1.0, 2.0], key="loss/policy")
    with pytest.raises(ValueError, match="loss/policy"):
        plot_reward_curve(path, tmp_path / "r.png")


def test_rise_report_strongly_increasing(tmp_path):
    # values 0..9, n=10, window k = 2: first [0, 1], last [8, 9].
    # means 0.5 and 8.5; std(ddof=1) of two values 1 apart = 1/sqrt(2); se = that/sqrt(2) = 0.5.
    # z = 8 / sqrt(0.25 + 0.25) = 8 / 0.7071 = 11.31 > 3.
    report = rise_report(_write(tmp_path / "m.jsonl", [float(v) for v in range(10)]))
    assert report["n_steps"] == 10 and report["window"] == 2
    assert report["first_mean"] == 0.5 and report["last_mean"] == 8.5
    assert report["first_se"] == pytest.approx(0.5) and report["last_se"] == pytest.approx(0.5)
    assert report["z"] == pytest.approx(8 / math.sqrt(0.5))
    assert report["rose"] is True


def test_rise_report_flat_noisy(tmp_path):
    # Alternating 0, 1: both windows are [0, 1], so z = 0.
    report = rise_report(_write(tmp_path / "m.jsonl", [0.0, 1.0] * 5))
    assert report["first_mean"] == report["last_mean"] == 0.5
    assert report["z"] == 0.0 and report["rose"] is False


def test_rise_report_constant_and_small_rise(tmp_path):
    flat = rise_report(_write(tmp_path / "a.jsonl", [2.0] * 8))
    assert flat["z"] == 0.0 and flat["rose"] is False
    # n=10: first [0, 1] mean 0.5 se 0.5; last [1, 2] mean 1.5 se 0.5; z = 1 / 0.7071 = 1.41 < 3.
    small = rise_report(_write(tmp_path / "b.jsonl", [0.0, 1.0, 0, 0, 0, 0, 0, 0, 1.0, 2.0]))
    assert small["z"] == pytest.approx(1 / math.sqrt(0.5)) and small["rose"] is False


def test_rise_report_skips_nulls_and_needs_five_steps(tmp_path):
    path = _write(tmp_path / "m.jsonl", [1.0, float("nan"), 2.0, 3.0, float("nan")])
    with pytest.raises(ValueError, match="3 logged steps"):
        rise_report(path)
    with pytest.raises(ValueError, match="frac"):
        rise_report(path, frac=0.8)
