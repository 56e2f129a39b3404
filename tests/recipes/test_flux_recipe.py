"""The tiny FLUX.1 and FLUX.1-Kontext recipes train end to end, and their whole runs learn.

`tiny_flux_flowgrpo`'s and `tiny_flux_kontext_flowgrpo`'s whole learning runs (marked `long`: left
out of the default run, with a 2-step run of each in it instead) are judged like the demo, in a
subprocess as a user runs it: the mean reward of the last 20% of steps beats the first 20% by
more than 3 standard errors, with the rollout's and the trainer's log-probs the same function
(ratio 1 on the first mini-batch, gap <= 1e-5: `recipe_runs.train` checks both on every step);
each leaves the LoRA in diffusers' format, and the edit recipe's validation grid has rows of a
source image and its edits.
"""
from pathlib import Path

import pytest
from PIL import Image

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train


def run(recipe: str, out: Path, *overrides: str) -> list[dict]:
    steps = train(out, recipe, *overrides)
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
    return steps


@pytest.mark.slow
@pytest.mark.long
def test_tiny_flux_flowgrpo_learns(tmp_path):
    out = tmp_path / "flux"
    steps = run("tiny_flux_flowgrpo", out)
    assert len(steps) == 40
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report


def test_tiny_flux_flowgrpo_trains(tmp_path):
    out = tmp_path / "flux_short"
    steps = run("tiny_flux_flowgrpo", out, "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2")
    assert len(steps) == 2
    assert (out / "samples" / "val_step_000002.png").is_file()


@pytest.mark.slow
@pytest.mark.long
def test_tiny_flux_kontext_flowgrpo_learns(tmp_path):
    out = tmp_path / "flux_kontext"
    steps = run("tiny_flux_kontext_flowgrpo", out)
    assert len(steps) == 50
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report


def test_tiny_flux_kontext_flowgrpo_trains(tmp_path):
    out = tmp_path / "flux_kontext_short"
    steps = run("tiny_flux_kontext_flowgrpo", out, "trainer.total_steps=2", "trainer.val_every=2",
                "trainer.save_every=2")
    assert len(steps) == 2
    grid = Image.open(out / "samples" / "val_step_000002.png")
    assert grid.width > grid.height  # rows of a source and its edits
