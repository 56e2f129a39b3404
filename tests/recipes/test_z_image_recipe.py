"""The tiny Z-Image recipe trains end to end, as a user runs it (a subprocess of main_omni.py),
with the rollout's and the trainer's log-probs the same function (ratio 1 on the first
mini-batch, gap <= 1e-5: `recipe_runs.train`) and the LoRA left in diffusers' format.

Its whole learning run (marked `long`: left out of the default run for time, with a 3-step run
in it instead) is judged like the other tiny recipes: the mean reward of the last 20% of steps
beats the first 20% by more than 3 standard errors (`rise_report`)."""
import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train


def run(out, *overrides: str) -> list[dict]:
    steps = train(out, "tiny_z_image_flowgrpo", *overrides)
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
    return steps


@pytest.mark.slow
@pytest.mark.long
def test_tiny_z_image_flowgrpo_learns(tmp_path):
    out = tmp_path / "z_image"
    steps = run(out)
    assert len(steps) == 40
    report = rise_report(out / "metrics.jsonl")
    assert report["rose"], report


def test_tiny_z_image_flowgrpo_trains(tmp_path):
    out = tmp_path / "z_image_short"
    steps = run(out, "trainer.total_steps=3", "trainer.val_every=3", "trainer.save_every=3")
    assert len(steps) == 3
    assert (out / "samples" / "val_step_000003.png").is_file()
