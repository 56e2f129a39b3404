"""`benchmarks/bare_loop.py`, the plain torch floor under `tiny_sd3_flowgrpo`'s step: it runs, counts
the trainer's forwards (it stops if they differ), scores the trainer's rewards from the same seed,
writes the trainer's metric names, and refuses a recipe it was not written for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import QUIET

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/bare_loop.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def bare_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("bare")
    proc = run("--steps", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_bare_loop_does_the_trainers_work(bare_rows):
    rows = bare_rows
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["forwards/rollout"] == 6 and r["forwards/update"] == 12  # 6 steps x 1 batch; 4 micro x 3 window steps
        assert {"timing/rollout", "timing/reward", "timing/update", "timing/step"} <= set(r)
        assert 0.0 < r["reward/total/mean"] < 1.0


def test_the_bare_loop_scores_the_trainers_rewards(tmp_path, bare_rows):
    # The same recipe and seed (trainer.seed, 42): the same LoRA initialisation, prompts, sample
    # seeds, noise, SDE windows and mini-batch shuffle, so the same images and rewards at step 1,
    # and after one update of the same maths the same at step 2. Not bit for bit: the trainer
    # batches some work in other shapes (BLAS rounds by shape), so each step's reward mean and std
    # agree within 1e-5 (brightness is in [0, 1]; another seed moved step 1's mean by 4e-3 and its
    # std by 2e-3).
    out = tmp_path / "trainer"
    PPOTrainer(load_config(["recipe=tiny_sd3_flowgrpo", f"trainer.output_dir={out}", "trainer.total_steps=2",
                            "trainer.save_every=0", *QUIET])).fit()
    trainer_rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trainer_rows] == [1, 2]
    for bare, ours in zip(bare_rows, trainer_rows):
        for key in ("reward/total/mean", "reward/total/std"):
            assert bare[key] == pytest.approx(ours[key], abs=1e-5), (bare["step"], key)


def test_another_recipe_is_refused():
    proc = run("--recipe", "tiny_qwen3_grpo", "--out", "unused")
    assert proc.returncode == 2 and "written for tiny_sd3_flowgrpo only" in proc.stderr


def test_only_reward_overrides_are_taken():
    proc = run("--override", "rollout.sampling_options.num_steps=3", "--out", "unused")
    assert proc.returncode == 2 and "takes only reward.* overrides" in proc.stderr

