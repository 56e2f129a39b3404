"""Cross-field rules of the config (omni_rl/config/validate.py).

Most rules are checked on `OmniConfig` objects built in Python (no Hydra, fast). The names of
registered components (policy loss, kernel, reward, adapter, ...) are checked through
`load_config`: a recipe or override naming an unknown one must fail at load with a ConfigError,
not minutes later when the trainer builds the component (after the model has been loaded).
"""
import pytest

from omni_rl.compose import load_config
from omni_rl.config import OmniConfig, validate_config
from omni_rl.errors import ConfigError
from omni_rl.config.options import bind_options
from omni_rl.config.schema import DataConfig, RewardConfig, RewardItemConfig
from omni_rl.families.sampling import DiffusionSampling


def valid() -> OmniConfig:
    return OmniConfig(data=DataConfig(prompts=["a cat"]))


def validate_error(cfg: OmniConfig) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def sampling(**values) -> DiffusionSampling:
    """The diffusion family's sampling block bound as at load: its rules are its `check()`."""
    return bind_options(DiffusionSampling, values, "rollout.sampling_options", "model family DiffusionFamily")


def sampling_error(**values) -> str:
    with pytest.raises(ConfigError) as info:
        sampling(**values)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_schema_defaults_plus_prompts_are_valid():
    validate_config(valid())


def test_prompts_are_required():
    cfg = valid()
    cfg.data.prompts = None
    assert "data.prompts" in validate_error(cfg)
    cfg.data.prompt_file = "prompts.txt"  # a file instead of a list is fine
    validate_config(cfg)


# --- SDE window -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 6])
def test_sde_window_up_to_num_steps_is_valid(size):
    sampling(num_steps=6, sde_window_size=size)


def test_sde_window_larger_than_num_steps():
    message = sampling_error(num_steps=6, sde_window_size=7)
    assert message.startswith("rollout.sampling_options.sde_window_size=7") and "rollout.sampling_options.num_steps = 6" in message


def test_negative_sde_window():
    assert "rollout.sampling_options.sde_window_size=-1" in sampling_error(sde_window_size=-1)


@pytest.mark.parametrize("window_range", [[0, 7], [-1, 3], [3, 3], [4, 2], [0, 1, 2], [5]])
def test_sde_window_range_outside_the_steps(window_range):
    assert "rollout.sampling_options.sde_window_range" in sampling_error(num_steps=6, sde_window_size=1,
                                                                         sde_window_range=window_range)


def test_sde_window_range_narrower_than_the_window():
    assert "rollout.sampling_options.sde_window_range" in sampling_error(num_steps=6, sde_window_size=3,
                                                                         sde_window_range=[1, 3])
    sampling(num_steps=6, sde_window_size=3, sde_window_range=[1, 4])  # exactly as wide as the window


def test_sde_window_range_with_window_zero_must_cover_every_step():
    # sde_window_size=0 means every step, so the range must span all num_steps.
    message = sampling_error(num_steps=6, sde_window_size=0, sde_window_range=[0, 5])
    assert "rollout.sampling_options.sde_window_range" in message
    # It names the value the user set (0, every step) and the 6 it stands for, never
    # "sde_window_size = 6" (issue 45, N15).
    assert "sde_window_size = 6" not in message
    assert "6 steps wide (rollout.sampling_options.num_steps, since rollout.sampling_options.sde_window_size=0 makes every step stochastic)" in message


# --- batch sizes ----------------------------------------------------------------------------
def test_mini_batch_must_divide_the_samples_of_a_step():
    cfg = valid()
    t = cfg.trainer
    t.prompts_per_step, t.samples_per_prompt, t.mini_batch_size, t.micro_batch_size = 4, 8, 12, 4
    message = validate_error(cfg)  # 4 * 8 = 32 samples; 32 % 12 != 0
    assert message.startswith("trainer.mini_batch_size=12") and "32" in message
    t.mini_batch_size = 32  # one optimizer step per epoch
    validate_config(cfg)


def test_micro_batch_must_divide_the_mini_batch():
    cfg = valid()
    cfg.trainer.mini_batch_size, cfg.trainer.micro_batch_size = 16, 6
    message = validate_error(cfg)
    assert message.startswith("trainer.micro_batch_size=6") and "16" in message


def test_micro_batch_larger_than_the_mini_batch():
    cfg = valid()
    cfg.trainer.mini_batch_size, cfg.trainer.micro_batch_size = 8, 16
    assert "trainer.micro_batch_size" in validate_error(cfg)


@pytest.mark.parametrize("key", [
    "total_steps", "prompts_per_step", "samples_per_prompt", "mini_batch_size", "micro_batch_size",
])
def test_sizes_must_be_positive(key):
    cfg = valid()
    setattr(cfg.trainer, key, 0)
    assert f"trainer.{key}=0" in validate_error(cfg)


# --- algorithm and model --------------------------------------------------------------------
def test_kl_needs_lora_for_the_reference_policy():
    cfg = valid()
    cfg.algo.kl_coef = 0.04
    validate_config(cfg)  # with LoRA the reference is the base model (adapters disabled)
    cfg.model.lora.enabled = False
    assert validate_error(cfg).startswith("algo.kl_coef=0.04")
    cfg.algo.kl_coef = 0.0  # full fine-tuning without KL is fine
    validate_config(cfg)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "float64", "torch.float32", ""])
def test_bad_dtype(dtype):
    cfg = valid()
    cfg.model.dtype = dtype
    assert f"model.dtype={dtype!r}" in validate_error(cfg)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_good_dtypes(dtype):
    cfg = valid()
    cfg.model.dtype = dtype
    validate_config(cfg)


@pytest.mark.parametrize("section, key, value", [
    ("algo", "old_logprob_mode", "reuse"),
    ("algo", "kl_coef", -0.1),
    ("optim", "lr", 0.0),
    ("optim", "betas", [0.9]),
    ("optim", "betas", [0.9, 1.0]),
    ("model.lora", "init", "xavier"),
])
def test_bad_values_name_the_key(section, key, value):
    cfg = valid()
    target = cfg
    for part in section.split("."):
        target = getattr(target, part)
    setattr(target, key, value)
    assert f"{section}.{key}=" in validate_error(cfg)


@pytest.mark.parametrize("key, value", [("height", 30), ("guidance_scale", 0.5)])
def test_bad_sampling_values_name_the_key(key, value):
    assert f"rollout.sampling_options.{key}=" in sampling_error(**{key: value})


@pytest.mark.parametrize("override, key", [
    ("algo.advantage_options.std_mode=batch", "algo.advantage_options.std_mode="),
    ("algo.policy_loss_options.flow_grpo.clip_range=0.0", "algo.policy_loss_options.flow_grpo.clip_range="),
    ("rollout.sampling_options.kernel=ode", "rollout.sampling_options.kernel="),
    ("rollout.sampling_options.noise_level=0.0", "rollout.sampling_options.noise_level="),  # the diffusion family's kernel rule
])
def test_bad_component_values_name_the_key_at_load(override, key):
    """The rules that moved from the schema's validation to the components that own them (the
    advantage estimators', a loss's options, the diffusion family's kernel rule) still name the key."""
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert str(info.value).startswith(key) and "\n" not in str(info.value)


def test_an_empty_reward_list():
    cfg = valid()
    cfg.reward = RewardConfig(rewards=[])
    assert "reward.rewards" in validate_error(cfg)


# --- registered names are checked at load ---------------------------------------------------
# Each failing override must raise ConfigError naming the key, the bad value and (so the fix is
# in the message) at least one valid name.
@pytest.mark.parametrize("override, key, bad, a_valid_name", [
    ("algo.policy_loss=flow_grpoo", "algo.policy_loss", "flow_grpoo", "flow_grpo"),
    ("algo.advantage=grpoo", "algo.advantage", "grpoo", "grpo"),
    ("algo.family_options.kl_form=exakt", "algo.family_options.kl_form", "exakt", "exact"),
    ("rollout.sampling_options.kernel=sdee", "rollout.sampling_options.kernel", "sdee", "sde"),
    ("model.adapter=StableDifusion3Pipeline", "model.adapter", "StableDifusion3Pipeline", "StableDiffusion3Pipeline"),
    ("reward.rewards=[{name: jpeg_compresibility}]", "reward.rewards", "jpeg_compresibility", "jpeg_compressibility"),
    ("rollout.backend=vlm", "rollout.backend", "vlm", "native"),
    ("trainer.loggers=[console,tensorbord]", "trainer.loggers", "tensorbord", "tensorboard"),
    ("trainer.device=tpu", "trainer.device", "tpu", "cpu"),
])
def test_unknown_component_names_fail_at_load(override, key, bad, a_valid_name):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    message = str(info.value)
    assert key in message and bad in message
    assert a_valid_name in message.replace(bad, ""), "the message should list the valid names"
    assert "\n" not in message


@pytest.mark.parametrize("overrides, family, valid", [
    (["algo.policy_loss=gspo"], "diffusion", "flow_dppo, flow_grpo, grpo_guard"),
    (["recipe=tiny_qwen3_grpo", "algo.policy_loss=flow_grpo"], "autoregressive", "cispo, dapo, gspo, ppo_clip, sapo"),
])
def test_a_loss_of_the_other_family_fails_at_load(overrides, family, valid):
    """A token loss on a diffusion model (or the reverse) stops at load, not after a rollout:
    one line naming the key, the value, the model's family and the losses valid for it."""
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    message = str(info.value)
    bad = overrides[-1].split("=")[1]
    assert message.startswith(f"algo.policy_loss={bad!r}: a ") and f"family {family}" in message
    assert valid in message and "\n" not in message


def test_each_family_loads_its_own_losses():
    for loss in ("flow_grpo", "flow_dppo", "grpo_guard"):
        assert load_config([f"algo.policy_loss={loss}"]).algo.policy_loss == loss
    for loss in ("ppo_clip", "dapo", "gspo", "cispo", "sapo"):
        assert load_config(["recipe=tiny_qwen3_grpo", f"algo.policy_loss={loss}"]).algo.policy_loss == loss


def test_unknown_reward_option_fails_at_load():
    with pytest.raises(ConfigError) as info:
        load_config(["reward.rewards=[{name: jpeg_compressibility, reward_options: {scael: 0.002}}]"])
    assert "jpeg_compressibility" in str(info.value) and "scael" in str(info.value)


def test_validation_rewards_are_checked_as_the_training_rewards_are():
    cfg = load_config(["reward.val_rewards=[{name: geneval_shapes}]"])
    assert [r.name for r in cfg.reward.val_rewards] == ["geneval_shapes"]
    with pytest.raises(ConfigError, match=r"reward\.val_rewards\[0\]\.name='nosuch': unknown reward"):
        load_config(["reward.val_rewards=[{name: nosuch}]"])
    with pytest.raises(ConfigError, match=r"reward\.val_rewards\[0\]\.reward_options: .*partial_credit"):
        load_config(["reward.val_rewards=[{name: geneval_shapes, reward_options: {partial_credit: 2}}]"])
    cfg = valid()
    cfg.reward.val_rewards = []
    assert "reward.val_rewards" in validate_error(cfg)
    cfg.reward.val_rewards = [RewardItemConfig("brightness"), RewardItemConfig("brightness")]
    assert "reward.val_rewards" in validate_error(cfg) and "brightness" in validate_error(cfg)


@pytest.mark.parametrize("override", [
    "algo.policy_loss=flow_dppo", "algo.policy_loss=grpo_guard", "algo.advantage=rloo",
    "algo.advantage=dr_grpo", "algo.family_options.kl_form=exact", "rollout.sampling_options.kernel=cps", "rollout.sampling_options.kernel=dance_sde",
    "reward.rewards=[{name: brightness}, {name: jpeg_compressibility, weight: 0.5, reward_options: {scale: 0.002}}]",
    "trainer.loggers=[console,jsonl]", "trainer.device=cpu",
])
def test_registered_component_names_load(override):
    load_config([override])


# --- values the trainer would only reject at run time ---------------------------------------
def test_an_empty_prompt_list_fails_at_validation():
    cfg = valid()
    cfg.data.prompts = []
    assert "data.prompts" in validate_error(cfg)


@pytest.mark.parametrize("weight", [float("nan"), float("inf")])
def test_a_non_finite_reward_weight_fails_at_validation(weight):
    cfg = valid()
    cfg.reward.rewards[0].weight = weight
    assert "reward.rewards" in validate_error(cfg)


def test_a_reward_listed_twice_fails_at_validation():
    cfg = valid()
    cfg.reward = RewardConfig(rewards=[RewardItemConfig(name="brightness"), RewardItemConfig(name="brightness", weight=0.5)])
    message = validate_error(cfg)
    assert "reward.rewards" in message and "brightness" in message
