"""The algo options of the text losses (dual clip, Dr.GRPO's aggregation constant, the KL clamp) and
the group-size rule for group-relative advantages (omni_rl/config/validate.py, components.py)."""
import pytest
import torch

from omni_rl.algos.advantages import ADVANTAGE_ESTIMATORS, register_advantage_estimator
from omni_rl.compose import load_config
from omni_rl.config import ConfigError, OmniConfig, validate_config
from omni_rl.config.schema import AlgoConfig, DataConfig

# The default recipe samples 4 prompts; with one sample each a step has 4 samples.
ONE_SAMPLE = ["trainer.samples_per_prompt=1", "trainer.mini_batch_size=4", "trainer.micro_batch_size=4"]


def valid(**algo) -> OmniConfig:
    cfg = OmniConfig(data=DataConfig(prompts=["a cat"]))
    for key, value in algo.items():
        setattr(cfg.algo, key, value)
    return cfg


def validate_error(cfg: OmniConfig) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- one sample per prompt ------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_one_sample_per_prompt_is_an_error_for_group_relative_advantages(estimator):
    with pytest.raises(ConfigError) as info:
        load_config(ONE_SAMPLE + [f"algo.advantage={estimator}"])
    message = str(info.value)
    assert message.startswith("trainer.samples_per_prompt=1: expected >= 2")
    assert f"algo.advantage={estimator!r}" in message
    assert "advantage 0" in message and "set trainer.samples_per_prompt to 2 or more" in message
    assert "\n" not in message


@pytest.mark.parametrize("std_mode", ["group", "global", "none"])
def test_grpo_needs_a_group_in_every_std_mode(std_mode):
    # "global" and "none" still subtract the group mean, so a group of one is still 0.
    with pytest.raises(ConfigError, match="trainer.samples_per_prompt=1"):
        load_config(ONE_SAMPLE + [f"algo.std_mode={std_mode}"])


def test_two_samples_per_prompt_load():
    cfg = load_config(["trainer.samples_per_prompt=2", "trainer.mini_batch_size=8", "trainer.micro_batch_size=4"])
    assert cfg.trainer.samples_per_prompt == 2


def test_an_estimator_that_needs_no_group_allows_one_sample(monkeypatch):
    # Registered into the real registry for this test only.
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))

    def batch_baseline(inp):
        rewards = inp.rewards.to(torch.float32)
        return rewards - rewards.mean()

    register_advantage_estimator("test_batch_baseline", needs_group=False)(batch_baseline)
    cfg = load_config(ONE_SAMPLE + ["algo.advantage=test_batch_baseline"])
    assert cfg.algo.advantage == "test_batch_baseline"
    # ... and the error for grpo now names it as the way out.
    with pytest.raises(ConfigError, match="an algo.advantage that needs no group: test_batch_baseline"):
        load_config(ONE_SAMPLE)


# --- the loss options -----------------------------------------------------------------------
def test_the_options_default_to_off():
    algo = AlgoConfig()
    assert algo.clip_ratio_c is None and algo.loss_scale_factor is None and algo.kl_clamp is None


@pytest.mark.parametrize("algo", [
    dict(policy_loss="ppo_clip", clip_ratio_c=3.0),
    dict(policy_loss="dapo", clip_ratio_c=10.0),
    dict(policy_loss="ppo_clip", loss_agg_mode="seq-mean-token-sum-norm"),  # null: rollout.max_new_tokens
    dict(policy_loss="ppo_clip", loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=1024.0),
    dict(policy_loss="ppo_clip", kl_clamp=10.0),
])
def test_good_option_values(algo):
    validate_config(valid(**algo))


@pytest.mark.parametrize("algo, start, expected", [
    (dict(policy_loss="ppo_clip", clip_ratio_c=1.0), "algo.clip_ratio_c=1.0", "> 1"),
    (dict(policy_loss="gspo", clip_ratio_c=3.0), "algo.clip_ratio_c=3.0", "null with algo.policy_loss=gspo"),
    (dict(policy_loss="flow_grpo", clip_ratio_c=3.0), "algo.clip_ratio_c=3.0", "ppo_clip and dapo only"),
    (dict(loss_agg_mode="seq-mean-token-sum-normed"), "algo.loss_agg_mode='seq-mean-token-sum-normed'",
     "seq-mean-token-sum-norm"),
    (dict(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=0.0), "algo.loss_scale_factor=0.0", "> 0"),
    (dict(loss_agg_mode="token-mean", loss_scale_factor=512.0), "algo.loss_scale_factor=512.0",
     "null with algo.loss_agg_mode=token-mean"),
    (dict(kl_clamp=0.0), "algo.kl_clamp=0.0", "> 0"),
])
def test_bad_option_values_name_the_key(algo, start, expected):
    message = validate_error(valid(**algo))
    assert message.startswith(start) and expected in message


def test_a_verl_style_override_loads():
    cfg = load_config(["recipe=tiny_qwen3_grpo", "algo.policy_loss=ppo_clip", "algo.clip_ratio_c=3.0", "algo.kl_clamp=10",
                       "algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.loss_scale_factor=256"])
    assert (cfg.algo.clip_ratio_c, cfg.algo.kl_clamp, cfg.algo.loss_scale_factor) == (3.0, 10.0, 256.0)
