"""`benchmarks/bare_loop.py`, the plain torch floor under the demo's step: it runs, counts the
trainer's forwards (it stops if they differ), learns in the direction of its reward, writes the
trainer's metric names, and refuses a recipe it was not written for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/bare_loop.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_the_bare_loop_does_the_trainers_work(tmp_path):
    proc = run("--steps", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["forwards/rollout"] == 6 and r["forwards/update"] == 12  # 6 steps x 1 batch; 4 micro x 3 window steps
        assert {"timing/rollout", "timing/reward", "timing/update", "timing/step"} <= set(r)
        assert 0.0 < r["reward/total/mean"] < 1.0


def test_another_recipe_is_refused():
    proc = run("--recipe", "tiny_qwen3_grpo", "--out", "unused")
    assert proc.returncode == 2 and "written for tiny_sd3_flowgrpo only" in proc.stderr


def test_only_reward_overrides_are_taken():
    proc = run("--override", "rollout.num_steps=3", "--out", "unused")
    assert proc.returncode == 2 and "takes only reward.* overrides" in proc.stderr

