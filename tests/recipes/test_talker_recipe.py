"""The tiny talker recipe as a user runs it: `python main_omni.py recipe=tiny_qwen3_omni_talker_grpo`.
Its whole learning run is the talker family's in the default run: the loudness reward rises
(`rise_report` z > 3), the rollout's and the trainer's log-probs agree on every step (first
mini-batch ratio 1, gap <= 1e-5), and validation writes each sample's WAV with its spoken text
and reward.

`tiny_qwen3_omni_thinker_talker_grpo` (`model.stage=thinker_talker`) learns on a reward that depends
on both halves: the total rises (z > 3), and so does each half's part of it, the answer's
`char_match` (the thinker's) and the waveform's `audio_loudness` (the talker's)."""
import json
import wave

import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import train

RECIPE = "tiny_qwen3_omni_talker_grpo"


@pytest.mark.slow
def test_tiny_talker_recipe_learns_loudness_and_writes_its_speech(tmp_path):
    out = tmp_path / "run"
    steps = train(out, RECIPE)
    assert len(steps) == 30
    report = rise_report(out / "metrics.jsonl")
    assert report["z"] > 3, report
    folder = out / "samples" / "val_step_000030"
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 4  # val_num_prompts 2 x val_samples_per_prompt 2
    for record in records:
        assert record["spoken_text"] and isinstance(record["reward"], float)
        with wave.open(str(folder / record["wav"]), "rb") as wav:
            assert wav.getframerate() == 24000 and wav.getnchannels() == 1 and wav.getnframes() > 0


@pytest.mark.slow
def test_tiny_thinker_talker_recipe_learns_on_a_reward_of_both_halves(tmp_path):
    out = tmp_path / "joint"
    steps = train(out, "tiny_qwen3_omni_thinker_talker_grpo")
    assert len(steps) == 40
    report = rise_report(out / "metrics.jsonl")
    assert report["z"] > 3, report
    # Each half's part: measured z >= 4.1 (loudness) and >= 23 (char_match) on two seeds; 2 here
    # leaves room for another CPU's rounding.
    for part in ("reward/char_match/mean", "reward/audio_loudness/mean"):
        part_report = rise_report(out / "metrics.jsonl", part)
        assert part_report["z"] > 2, part_report
