"""The tiny BAGEL recipes train end to end, in a subprocess as a user runs them: the rollout's and the
trainer's log-probs are the same function (first mini-batch ratio 1, <= 1e-5 apart), the LoRA is
left in PEFT's format, and over each recipe's whole run (`slow`, `long`) the mean reward of the last 20% of steps
beats the first 20% by more than 3 standard errors (`rise_report`). The editing recipe
(`tiny_bagel_edit_flowgrpo`, `model.stage=edit`) runs 2 steps here and leaves validation grids whose
rows start with the source image. The think-then-draw recipe (`tiny_bagel_think_flowgrpo`,
`model.stage=think`) runs 2 steps here: one trajectory of plan tokens and image steps, on-policy
on both, its validation records carrying each greedy plan."""
import json
from pathlib import Path

import pytest
from PIL import Image

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train


def run(out: Path, recipe: str, *overrides: str) -> list[dict]:
    steps = train(out, recipe, *overrides)
    assert (out / "lora" / "adapter_model.safetensors").is_file()
    assert (out / "lora" / "adapter_config.json").is_file()
    return steps


def test_tiny_bagel_flowgrpo_trains(tmp_path):
    steps = run(tmp_path / "bagel", "tiny_bagel_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2",
                "trainer.save_every=2")
    assert len(steps) == 2


def test_tiny_bagel_edit_flowgrpo_trains(tmp_path):
    out = tmp_path / "bagel_edit"
    steps = run(out, "tiny_bagel_edit_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2
    grid = Image.open(out / "samples" / "val_step_000002.png")
    assert grid.width > grid.height  # rows of a source and its edits


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("recipe, total_steps", [
    ("tiny_bagel_flowgrpo", 40), ("tiny_bagel_edit_flowgrpo", 50), ("tiny_bagel_think_flowgrpo", 40),
])
def test_the_whole_recipe_learns(tmp_path, recipe, total_steps):
    out = tmp_path / recipe
    assert len(run(out, recipe)) == total_steps
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report


def test_tiny_bagel_think_flowgrpo_trains(tmp_path):
    out = tmp_path / "bagel_think"
    steps = run(out, "tiny_bagel_think_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2
    assert all(0 < r["response/plan_length_mean"] <= 8 for r in steps)
    assert all("loss/plan_policy_loss" in r for r in steps)
    records = [json.loads(line) for line in (out / "samples" / "val_step_000002.jsonl").read_text().splitlines()]
    assert len(records) == 16 and all(isinstance(r["plan"], str) for r in records)
    assert (out / "samples" / "val_step_000002.png").is_file()
