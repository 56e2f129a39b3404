"""The tiny BAGEL recipe trains end to end, in a subprocess as a user runs it: the rollout's and the
trainer's log-probs are the same function (first mini-batch ratio 1, <= 1e-5 apart), the LoRA is
left in PEFT's format, and over the whole run (`slow`) the mean reward of the last 20% of steps
beats the first 20% by more than 3 standard errors (`rise_report`)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.logging import rise_report

ROOT = Path(__file__).resolve().parents[2]


def run(out: Path, *overrides: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "main_omni.py", "recipe=tiny_bagel_flowgrpo", f"trainer.output_dir={out}",
         "trainer.progress_bar=false", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "actor/first_minibatch_ratio_max_abs_dev" in r]
    assert max(r["actor/first_minibatch_ratio_max_abs_dev"] for r in steps) <= 1e-6
    assert max(r["rollout_corr/logprob_abs_diff_max"] for r in steps) <= 1e-5
    assert (out / "lora" / "adapter_model.safetensors").is_file()
    assert (out / "lora" / "adapter_config.json").is_file()
    return steps


def test_tiny_bagel_flowgrpo_trains(tmp_path):
    steps = run(tmp_path / "bagel", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2


@pytest.mark.slow
@pytest.mark.long
def test_tiny_bagel_flowgrpo_learns(tmp_path):
    out = tmp_path / "bagel_full"
    assert len(run(out)) == 40
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report
