"""The forward-process losses' config rules: their keys are checked at load with the key, the
value and the fix in the message; ODE rollouts train them; the lists the config layer keeps
match the registries they mirror."""
import pytest

from omni_rl.algos.forward_losses import FORWARD_LOSSES, NFT_WEIGHTINGS
from omni_rl.compose import load_config
from omni_rl.config.validate import FORWARD_PROCESS_LOSSES, FORWARD_TIMESTEP_SAMPLINGS, ConfigError
from omni_rl.config.validate import NFT_WEIGHTINGS as CONFIG_NFT_WEIGHTINGS
from omni_rl.families.forward_draws import TIMESTEP_SAMPLINGS


def test_the_config_lists_match_the_registries():
    assert sorted(FORWARD_PROCESS_LOSSES) == FORWARD_LOSSES.names()
    assert FORWARD_TIMESTEP_SAMPLINGS == TIMESTEP_SAMPLINGS and CONFIG_NFT_WEIGHTINGS == NFT_WEIGHTINGS


@pytest.mark.parametrize("recipe", ["tiny_sd3_diffusion_nft", "tiny_sd3_diffusion_dpo"])
def test_the_recipes_load_with_an_ode_rollout(recipe):
    cfg = load_config([f"recipe={recipe}"])
    assert cfg.rollout.kernel == "ode" and cfg.algo.policy_loss in FORWARD_LOSSES


def test_ode_still_refused_for_a_step_loss():
    with pytest.raises(ConfigError, match="rollout.kernel='ode'.*flow_grpo"):
        load_config(["recipe=tiny_sd3_diffusion_nft", "algo.policy_loss=flow_grpo"])


@pytest.mark.parametrize("override, key, fix", [
    ("algo.nft_ema_decay=1.0", "algo.nft_ema_decay=1.0", "in [0, 1)"),
    ("algo.nft_beta=0", "algo.nft_beta=0", "> 0"),
    ("algo.nft_weighting=x0", "algo.nft_weighting='x0'", "velocity, adaptive_x0"),
    ("algo.forward_num_timesteps=0", "algo.forward_num_timesteps=0", ">= 1"),
    ("algo.forward_timestep_sampling=beta", "algo.forward_timestep_sampling='beta'", "uniform, logit_normal"),
    ("algo.dpo_beta=-1", "algo.dpo_beta=-1", "> 0"),
    ("algo.kl_coef=0.1", "algo.kl_coef=0.1", "remove algo.kl_coef"),
    ("algo.rollout_is=step", "algo.rollout_is='step'", "nothing to correct"),
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
        load_config(["recipe=tiny_sd3_diffusion_nft", "algo.policy_loss=diffusion_nfft", "rollout.kernel=sde",
                     "rollout.noise_level=0.7"])
    assert "algo.policy_loss='diffusion_nfft'" in str(err.value) and "diffusion_nft" in str(err.value)
    assert "flow_grpo" in str(err.value)
