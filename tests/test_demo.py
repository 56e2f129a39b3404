"""The newcomer's first command: `python main_omni.py` trains the tiny demo and the reward rises.

This runs the real default recipe end to end in a subprocess (about three minutes on 2 CPU
cores), then judges the run from its metrics.jsonl the way the README does: the mean reward of
the last 20% of steps must beat the first 20% by more than 3 standard errors.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.logging import rise_report

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_default_demo_learns(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "main_omni.py", f"trainer.output_dir={out}", "trainer.progress_bar=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "actor/first_minibatch_ratio_max_abs_dev" in r]
    assert len(train) == 80
    assert max(r["actor/first_minibatch_ratio_max_abs_dev"] for r in train) <= 1e-6
    assert max(r["rollout_corr/logprob_abs_diff_max"] for r in train) <= 1e-5
    assert (out / "reward_curve.png").is_file()
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
