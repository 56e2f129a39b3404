"""The agent family through the trainer (tiny tools Qwen3, guess_number turns): a few steps train,
every limit-cut trajectory included, and a resume in the middle repeats the straight run's rewards."""
import json

import pytest

from omni_rl.compose import load_config
from omni_rl.trainer import PPOTrainer

SMALL = [
    "recipe=tiny_qwen3_calculator_agent", "model.path=tiny:qwen3_tools", "algo.family_options.agent_options.environment=guess_number",
    "algo.family_options.agent_options.environment_options.high=1000000", "algo.family_options.agent_options.max_turns=2", "algo.family_options.agent_options.max_total_tokens=96",
    "rollout.sampling_options.max_new_tokens=6", "reward.rewards=[{name: trajectory_return}]", "reward.val_rewards=null",
    "algo.family_options.agent_options.turn_reward=discounted", "algo.family_options.agent_options.discount=0.5",
    "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=4", "trainer.val_every=0", "trainer.logger_options.progress_bar=false",
    "trainer.loggers=[jsonl]", "trainer.save_every=1",
]


def run(tmp_path, name, *overrides):
    cfg = load_config([*SMALL, f"trainer.output_dir={tmp_path / name}", *overrides])
    PPOTrainer(cfg).fit()
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_two_agent_steps_train_on_what_the_trajectories_have(tmp_path):
    records = run(tmp_path, "two", "trainer.total_steps=2")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["agent/finish/max_turns"] + r["agent/finish/max_total_tokens"] + r["agent/finish/environment"] == 1.0
        assert r["agent/fed_tokens_mean"] > 0 and r["agent/model_tokens_mean"] > 0
        # On-policy: the first mini-batch's ratio is exactly 1 on the model's tokens, and the
        # rollout's log-probs are the trainer's to 1e-5 (fp32).
        assert r["actor/first_minibatch_ratio_max_abs_dev"] == 0.0
        assert r["rollout_corr/logprob_abs_diff_max"] <= 1e-5


@pytest.mark.long  # three runs of the trainer (about a minute on a loaded 2-core machine)
def test_a_resume_repeats_the_straight_runs_rewards(tmp_path):
    straight = run(tmp_path, "straight", "trainer.total_steps=3")
    run(tmp_path, "split", "trainer.total_steps=2")
    resumed = run(tmp_path, "split", "trainer.total_steps=3", f"trainer.resume={tmp_path / 'split'}")
    assert resumed[-1]["step"] == 3
    assert resumed[-1]["reward/total/mean"] == pytest.approx(straight[-1]["reward/total/mean"], abs=1e-6)
    assert resumed[-1]["agent/turns_mean"] == straight[-1]["agent/turns_mean"]
