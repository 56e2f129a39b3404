"""The tiny BAGEL recipe trains end to end, in a subprocess as a user runs it: the rollout's and the
trainer's log-probs are the same function (first mini-batch ratio 1, <= 1e-5 apart), the LoRA is
left in PEFT's format, and over the whole run (`slow`) the mean reward of the last 20% of steps
beats the first 20% by more than 3 standard errors (`rise_report`)."""
from pathlib import Path

import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train


def run(out: Path, *overrides: str) -> list[dict]:
    steps = train(out, "tiny_bagel_flowgrpo", *overrides)
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
