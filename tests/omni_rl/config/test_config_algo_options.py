"""The options of the text losses (dual clip, Dr.GRPO's aggregation constant, the KL clamp), set in
their block `algo.policy_loss_options.NAME` and checked at load by the loss's options, and the group-size
rule for group-relative advantages (omni_rl/compose.py)."""
import pytest
import torch

from omni_rl.algos.advantages import ADVANTAGE_ESTIMATORS, register_advantage_estimator
from omni_rl.algos.token_losses import PPOClipLoss
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError

# The default recipe samples 4 prompts; with one sample each a step has 4 samples.
ONE_SAMPLE = ["trainer.samples_per_prompt=1", "trainer.mini_batch_size=4", "trainer.micro_batch_size=4"]


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
        load_config(ONE_SAMPLE + [f"algo.advantage_options.std_mode={std_mode}"])


def test_two_samples_per_prompt_load():
    cfg = load_config(["trainer.samples_per_prompt=2", "trainer.mini_batch_size=8", "trainer.micro_batch_size=4"])
    assert cfg.trainer.samples_per_prompt == 2


def test_an_estimator_that_needs_no_group_allows_one_sample(monkeypatch):
    # Registered into the real registry for this test only.
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_specs", dict(ADVANTAGE_ESTIMATORS._specs))

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
def text_config(loss: str, **options):
    return load_config(["recipe=tiny_qwen3_grpo", f"algo.policy_loss={loss}"]
                       + [f"algo.policy_loss_options.{loss}.{k}={v}" for k, v in options.items()])


def test_the_options_default_to_off():
    options = PPOClipLoss.Options()
    assert options.clip_ratio_c is None and options.loss_scale_factor is None and options.kl_clamp is None


@pytest.mark.parametrize("loss, options", [
    ("ppo_clip", dict(clip_ratio_c=3.0)),
    ("dapo", dict(clip_ratio_c=10.0)),
    ("ppo_clip", dict(loss_agg_mode="seq-mean-token-sum-norm")),  # null: rollout.sampling_options.max_new_tokens
    ("ppo_clip", dict(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=1024.0)),
    ("ppo_clip", dict(kl_clamp=10.0)),
])
def test_good_option_values(loss, options):
    text_config(loss, **options)


@pytest.mark.parametrize("loss, options, start, expected", [
    ("ppo_clip", dict(clip_ratio_c=1.0), "algo.policy_loss_options.ppo_clip.clip_ratio_c=1.0", "> 1"),
    ("gspo", dict(clip_ratio_c=3.0), "algo.policy_loss_options.gspo.clip_ratio_c=3.0", "loss gspo has no option 'clip_ratio_c'"),
    ("ppo_clip", dict(loss_agg_mode="seq-mean-token-sum-normed"),
     "algo.policy_loss_options.ppo_clip.loss_agg_mode='seq-mean-token-sum-normed'", "seq-mean-token-sum-norm"),
    ("ppo_clip", dict(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=0.0),
     "algo.policy_loss_options.ppo_clip.loss_scale_factor=0.0", "> 0"),
    ("ppo_clip", dict(loss_agg_mode="token-mean", loss_scale_factor=512.0), "algo.policy_loss_options.ppo_clip.loss_scale_factor=512.0",
     "null with loss_agg_mode=token-mean"),
    ("ppo_clip", dict(kl_clamp=0.0), "algo.policy_loss_options.ppo_clip.kl_clamp=0.0", "> 0"),
])
def test_bad_option_values_name_the_key(loss, options, start, expected):
    with pytest.raises(ConfigError) as info:
        text_config(loss, **options)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(start) and expected in message


def test_the_dual_clip_is_no_option_of_a_diffusion_loss():
    with pytest.raises(ConfigError, match="algo.policy_loss_options.flow_grpo.clip_ratio_c=3.0: loss flow_grpo has no option"):
        load_config(["algo.policy_loss_options.flow_grpo.clip_ratio_c=3.0"])


def test_a_verl_style_override_loads():
    cfg = load_config(["recipe=tiny_qwen3_grpo", "algo.policy_loss=ppo_clip", "algo.policy_loss_options.ppo_clip.clip_ratio_c=3.0",
                       "algo.policy_loss_options.ppo_clip.kl_clamp=10",
                       "algo.policy_loss_options.ppo_clip.loss_agg_mode=seq-mean-token-sum-norm",
                       "algo.policy_loss_options.ppo_clip.loss_scale_factor=256"])
    options = cfg.algo.policy_loss_options["ppo_clip"]
    assert (options.clip_ratio_c, options.kl_clamp, options.loss_scale_factor) == (3.0, 10, 256)
