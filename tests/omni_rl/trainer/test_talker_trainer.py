"""The talker family through the PPO trainer on the tiny Qwen3-Omni talker: every token loss
trains the frames (one action = a frame of 4 codec tokens, one summed log-prob), on-policy the
first mini-batch's ratio is exactly 1, and thinker_talker trains the answer and the frames in
one update."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.trainer import PPOTrainer
from tests.tiny_runs import TINY_TALKER


def run(tmp_path, name, *overrides):
    out = tmp_path / name
    PPOTrainer(load_config([*TINY_TALKER, f"trainer.output_dir={out}", *overrides])).fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss,extra", [
    ("ppo_clip", []),
    ("gspo", ["algo.policy_loss_options.gspo.clip_range=3e-4", "algo.policy_loss_options.gspo.clip_range_high=4e-4"]),
    ("dapo", ["algo.policy_loss_options.dapo.clip_range_high=0.28"]),
    ("cispo", []),
])
def test_every_token_loss_trains_the_frames(tmp_path, loss, extra):
    records = run(tmp_path, loss, "trainer.total_steps=1", f"algo.policy_loss={loss}", *extra)
    last = records[-1]
    assert last["actor/grad_norm"] > 0
    assert last["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
    assert last["rollout_corr/logprob_abs_diff_max"] <= 1e-5
    assert 1 <= last["response/speech_frames_mean"] <= 6


def test_thinker_talker_is_one_trajectory_with_one_update(tmp_path):
    records = run(tmp_path, "joint", "trainer.total_steps=1", "model.stage=thinker_talker", "model.lora.enabled=true",
                  "model.lora.rank=4", "optim.lr=1e-3")
    last = records[-1]
    assert last["actor/grad_norm"] > 0 and last["actor/num_updates"] == 1
    assert last["actor/first_minibatch_ratio_max_abs_dev"] <= 1e-6
    assert last["rollout_corr/logprob_abs_diff_max"] <= 1e-5


@pytest.mark.parametrize("override,key", [
    ("trainer.pipeline=one_step_off", "trainer.pipeline"),
    ("algo.kl_coef=0.1", "algo.kl_coef"),
    ("model.adapter_options.trainable=decoder", "trainable"),
    ("rollout.sampling_options.max_frames=0", "max_frames"),
])
def test_bad_talker_settings_fail_at_load(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key):
        load_config([*TINY_TALKER, f"trainer.output_dir={tmp_path}", override])
