"""The tiny talker recipe as a user runs it: `python main_omni.py recipe=tiny_qwen3_omni_talker_grpo`.
A 2-step run in the default test run (log-probs aligned, validation writes each sample's WAV with
its spoken text and reward); the whole learning run under `-m long`."""
import json
import wave

import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train

RECIPE = "tiny_qwen3_omni_talker_grpo"


def test_tiny_talker_recipe_runs_and_writes_its_speech(tmp_path):
    out = tmp_path / "run"
    steps = train(out, RECIPE, "trainer.total_steps=2", "trainer.val_every=2", "trainer.val_num_prompts=1")
    assert len(steps) == 2 and all(s["actor/first_minibatch_ratio_max_abs_dev"] == 0.0 for s in steps)
    folder = out / "samples" / "val_step_000002"
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["spoken_text"] and isinstance(record["reward"], float)
        with wave.open(str(folder / record["wav"]), "rb") as wav:
            assert wav.getframerate() == 24000 and wav.getnchannels() == 1 and wav.getnframes() > 0


@pytest.mark.slow
@pytest.mark.long
def test_tiny_talker_recipe_learns_loudness(tmp_path):
    out = tmp_path / "run"
    train(out, RECIPE)
    report = rise_report(out / "metrics.jsonl")
    assert report["z"] > 3, report
