"""The forward-process losses' config rules: their keys are checked at load with the key, the
value and the fix in the message; ODE rollouts train them. (The rules are the losses' options
and the diffusion family's, so the config layer keeps no list of them.)"""
import pytest

from omni_rl.algos.forward_losses import FORWARD_LOSSES
from omni_rl.compose import load_config
from omni_rl.errors import ConfigError


@pytest.mark.parametrize("recipe", ["tiny_sd3_diffusion_nft", "tiny_sd3_diffusion_dpo"])
def test_the_recipes_load_with_an_ode_rollout(recipe):
    cfg = load_config([f"recipe={recipe}"])
    assert cfg.rollout.sampling_options.kernel == "ode" and cfg.algo.policy_loss in FORWARD_LOSSES


def test_ode_still_refused_for_a_step_loss():
    with pytest.raises(ConfigError, match="rollout.sampling_options.kernel='ode'.*flow_grpo"):
        load_config(["recipe=tiny_sd3_diffusion_nft", "algo.policy_loss=flow_grpo"])


@pytest.mark.parametrize("override, key, fix", [
    ("algo.policy_loss_options.diffusion_nft.ema_decay=1.0", "algo.policy_loss_options.diffusion_nft.ema_decay=1.0", "in [0, 1)"),
    ("algo.policy_loss_options.diffusion_nft.beta=0", "algo.policy_loss_options.diffusion_nft.beta=0", "> 0"),
    ("algo.policy_loss_options.diffusion_nft.weighting=x0", "algo.policy_loss_options.diffusion_nft.weighting='x0'",
     "velocity, adaptive_x0"),
    ("algo.family_options.forward_num_timesteps=0", "algo.family_options.forward_num_timesteps=0", ">= 1"),
    ("algo.family_options.forward_timestep_sampling=beta", "algo.family_options.forward_timestep_sampling='beta'",
     "uniform, logit_normal"),
    ("algo.policy_loss_options.diffusion_dpo.beta=-1", "algo.policy_loss_options.diffusion_dpo.beta=-1", "> 0"),
    ("algo.kl_coef=0.1", "algo.kl_coef=0.1", "remove algo.kl_coef"),
    ("algo.rollout_correction_options.level=step", "algo.rollout_correction_options.level='step'", "nothing to correct"),
])
def test_bad_values_name_the_key_and_the_fix(override, key, fix):
    with pytest.raises(ConfigError) as err:
        load_config(["recipe=tiny_sd3_diffusion_nft", override])
    assert key in str(err.value) and fix in str(err.value)


def test_dpo_needs_lora_for_its_reference():
    with pytest.raises(ConfigError, match="model.lora.enabled=False.*reference policy"):
        load_config(["recipe=tiny_sd3_diffusion_dpo", "model.lora.enabled=false"])


def test_ray_refuses_them_naming_the_fix():
    with pytest.raises(ConfigError, match="algo.policy_loss='diffusion_nft'.*trainer.backend=local"):
        load_config(["recipe=tiny_sd3_diffusion_nft", "trainer.backend=ray"])


def test_a_typo_lists_the_forward_losses_too():
    with pytest.raises(ConfigError) as err:
        load_config(["recipe=tiny_sd3_diffusion_nft", "algo.policy_loss=diffusion_nfft", "rollout.sampling_options.kernel=sde",
                     "rollout.sampling_options.noise_level=0.7"])
    assert "algo.policy_loss='diffusion_nfft'" in str(err.value) and "diffusion_nft" in str(err.value)
    assert "flow_grpo" in str(err.value)
