"""The tiny MiniMax-H3 recipes (text to audio + video) run as a user runs them, in a subprocess.

FlowGRPO: two steps with the rollout's and the trainer's log-probs the same function (`train`),
both rewards scored, and a validation mp4 that plays with sound. The whole learning runs of both
recipes (FlowGRPO, and DiffusionNFT with modality-wise advantage routing) are marked `long`: the
total reward's z (`rise_report`) above 3 and each modality's reward rising, with each stream's own
advantage logged (docs/models.md, MiniMax-H3, has the measured numbers).
"""
import math

import pytest

from omni_rl.logging import rise_report
from tests.recipes.recipe_runs import run_recipe, train
from tests.recipes.test_video_recipes import played_streams


def test_tiny_minimax_h3_flowgrpo_runs_two_steps(tmp_path):
    out = tmp_path / "minimax_h3"
    steps = train(out, "tiny_minimax_h3_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2",
                  "trainer.save_every=2")
    assert len(steps) == 2
    assert all(r["loss/log_prob_mean"] != 0 for r in steps)
    assert all("reward/video_brightness/mean" in r and "reward/audio_loudness/mean" in r for r in steps)
    assert played_streams(out / "samples" / "val_step_000002" / "00.mp4") == ["audio", "video"]


def _each_modality_rose(out) -> None:
    for key in ("reward/total/mean", "reward/video_brightness/mean", "reward/audio_loudness/mean"):
        report = rise_report(out / "metrics.jsonl", key=key)
        assert report["last_mean"] > report["first_mean"], report
        if key == "reward/total/mean":
            assert report["z"] > 3, report


@pytest.mark.long
def test_tiny_minimax_h3_flowgrpo_learns_both_modalities(tmp_path):
    out = tmp_path / "minimax_h3_flowgrpo"
    steps = train(out, "tiny_minimax_h3_flowgrpo")
    assert len(steps) == 30
    assert steps[0]["loss/ratio_max_abs_dev"] == 0.0  # the first ratio is exactly 1
    _each_modality_rose(out)


@pytest.mark.long
def test_tiny_minimax_h3_diffusion_nft_learns_both_modalities_with_routed_advantages(tmp_path):
    out = tmp_path / "minimax_h3_nft"
    steps = run_recipe(out, "tiny_minimax_h3_diffusion_nft")
    assert len(steps) == 30
    for rec in steps:
        for key in ("loss/policy", "loss/policy/video", "loss/policy/audio", "actor/advantage_abs_mean/video",
                    "actor/advantage_abs_mean/audio"):
            assert math.isfinite(rec[key]), (key, rec[key])
    _each_modality_rose(out)
