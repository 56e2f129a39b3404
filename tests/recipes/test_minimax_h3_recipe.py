"""The tiny MiniMax-H3 recipe (text to audio + video, FlowGRPO) runs as a user runs it: two steps
in a subprocess with the rollout's and the trainer's log-probs the same function (`train`), both
rewards scored, and a validation mp4 that plays with sound."""
from tests.recipes.recipe_runs import train
from tests.recipes.test_video_recipes import played_streams


def test_tiny_minimax_h3_flowgrpo_runs_two_steps(tmp_path):
    out = tmp_path / "minimax_h3"
    steps = train(out, "tiny_minimax_h3_flowgrpo", "trainer.total_steps=2", "trainer.val_every=2",
                  "trainer.save_every=2")
    assert len(steps) == 2
    assert all(r["loss/log_prob_mean"] != 0 for r in steps)
    assert all("reward/video_brightness/mean" in r and "reward/audio_loudness/mean" in r for r in steps)
    assert played_streams(out / "samples" / "val_step_000002" / "00.mp4") == ["audio", "video"]
