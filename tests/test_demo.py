"""The newcomer's first command: `python main_omni.py` trains the shape demo and it learns.

This runs the real default recipe (`tiny_sd3_shapes_counting`: FlowGRPO LoRA on the pretrained
`tiny:sd3_shapes`, trained on the `geneval_shapes` reward's partial credit) end to end in a
subprocess, then judges it the way docs/demo.md does: GenEval accuracy of deterministic ODE
validation samples (fixed seeds, success only) rises between the first and the last validation
by more than 3 standard errors of the paired change (`val_rise`), with at least one task type up
by 10 points or more; the first mini-batch's ratio is 1 and the rollout's log-probs are the
trainer's. Then `--eval shapes_counting` measures the base and the trained LoRA, and `--compare`
shows the rise with its 95% paired-bootstrap interval above zero (docs/evaluation.md's worked
example).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.logging import val_rise

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_default_demo_learns(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "main_omni.py", f"trainer.output_dir={out}", "trainer.logger_options.progress_bar=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rise = val_rise(out)
    assert rise["z"] > 3, rise
    gains = {task: g["last_mean"] - g["first_mean"] for task, g in rise["groups"].items()}
    assert max(gains.values()) >= 0.10, rise
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "actor/first_minibatch_ratio_max_abs_dev" in r]
    assert train and max(r["actor/first_minibatch_ratio_max_abs_dev"] for r in train) <= 1e-6
    assert max(r["rollout_corr/logprob_abs_diff_max"] for r in train) <= 1e-5
    assert (out / "reward_curve.png").is_file()
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (out / "samples" / rise["last_file"]).with_suffix(".png").is_file()

    def evaluate(folder, *extra):
        done = subprocess.run([sys.executable, "main_omni.py", "--eval", "shapes_counting", *extra, "--eval-out",
                               str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((folder / "results.json").read_text())["figures"]

    before, after = tmp_path / "eval_base", tmp_path / "eval_trained"
    evaluate(before)
    evaluate(after, "--eval-model", str(out / "lora"))
    # The checkpoint is read, never written; its evaluation equals the exported LoRA's (both at
    # 8 samples a prompt, the same shapes: a quarter of the time of one whole evaluation).
    step = out / "checkpoints" / "step_000030"
    untouched = {p: p.stat().st_mtime_ns for p in step.rglob("*")}
    few = ("--protocol", "samples_per_prompt=8")
    from_checkpoint = evaluate(tmp_path / "eval_checkpoint", "--eval-model", str(step), *few)
    assert {p: p.stat().st_mtime_ns for p in step.rglob("*")} == untouched
    assert from_checkpoint == evaluate(tmp_path / "eval_lora_few", "--eval-model", str(out / "lora"), *few)
    table = subprocess.run([sys.executable, "main_omni.py", "--compare", str(before), str(after)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("accuracy/overall")).split()
    a, b, delta = float(row[1]), float(row[2]), float(row[3])
    low = float(row[4].strip("[,"))
    assert b > a and delta == pytest.approx(b - a, abs=1e-4) and low > 0, table.stdout
