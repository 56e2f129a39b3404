"""The algo options live with their components: a flat key that moved fails at load with one line
naming its new place, the loss's block is bound to the loss `algo.policy_loss` names (one block per
loss, so switching the loss keeps the others'), and `loss_options_class` gives any loss's options
for `--options`."""
import pytest

from omni_rl.algos.forward_losses import DiffusionNFTOptions
from omni_rl.algos.policy_losses import FlowDPPOOptions
from omni_rl.algos.token_losses import SAPOOptions
from omni_rl.compose import load_config, loss_options_class
from omni_rl.errors import ConfigError
from omni_rl.config.loader import MOVED_ALGO_KEYS
from omni_rl.config.schema import AlgoConfig
from omni_rl.families import TextFamily


def test_the_schema_keeps_only_what_every_run_reads():
    assert len(AlgoConfig.__dataclass_fields__) <= 10
    assert not set(AlgoConfig.__dataclass_fields__) & {key.split(".", 1)[1] for key in MOVED_ALGO_KEYS}


@pytest.mark.parametrize("override, new", [
    ("algo.kl_threshold=1e-3", "algo.policy_loss_options.flow_dppo.kl_threshold"),
    ("algo.nft_beta=2", "algo.policy_loss_options.diffusion_nft.beta"),
    ("algo.std_mode=group", "algo.advantage_options.std_mode"),
    ("algo.timestep_fraction=0.5", "algo.family_options.timestep_fraction"),
    ("algo.clip_range=0.2", "algo.policy_loss_options.<loss>.clip_range"),
    ("algo.rollout_is=step", "algo.rollout_correction_options.level"),
])
def test_an_old_flat_key_names_its_new_place(override, new):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    message = str(info.value)
    assert message.startswith(override.split("=")[0] + " moved: set " + new) and "\n" not in message


def test_an_old_flat_key_in_a_recipe_names_its_new_place(tmp_path):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("algo:\n  policy_loss: flow_dppo\n  kl_threshold: 1.0e-3\n")
    with pytest.raises(ConfigError, match=r"algo.kl_threshold moved: set algo.policy_loss_options.flow_dppo.kl_threshold .*old.yaml"):
        load_config([f"recipe={recipe}"])


def test_switching_the_loss_keeps_each_block_for_its_own_loss():
    # The default recipe sets flow_grpo's clip_range; flow_dppo has no clip, and loads with its own block.
    cfg = load_config(["algo.policy_loss=flow_dppo", "algo.policy_loss_options.flow_dppo.kl_threshold=1e-3"])
    assert cfg.algo.policy_loss_options[cfg.algo.policy_loss] == FlowDPPOOptions(kl_threshold=1e-3)
    assert cfg.algo.policy_loss_options["flow_grpo"].clip_range == 1e-3


def test_a_block_for_a_loss_of_the_other_family_is_refused():
    with pytest.raises(ConfigError, match=r"algo.policy_loss_options.ppo_clip: 'ppo_clip' is not a loss of this model's family"):
        load_config(["algo.policy_loss_options.ppo_clip.clip_range=0.2"])


def test_the_text_family_fills_dr_grpo_constant_from_the_response_budget():
    cfg = load_config(["recipe=tiny_qwen3_grpo", "algo.policy_loss_options.ppo_clip.loss_agg_mode=seq-mean-token-sum-norm"])
    assert cfg.algo.policy_loss_options[cfg.algo.policy_loss].loss_scale_factor is None  # null in the recipe's block ...
    from omni_rl.families.autoregressive import build_token_loss
    loss = build_token_loss(TextFamily.losses.get("ppo_clip"), cfg.algo.policy_loss_options[cfg.algo.policy_loss],
                            cfg.rollout.sampling_options, 0.0)
    assert loss.options.loss_scale_factor == cfg.rollout.sampling_options.max_new_tokens  # ... the budget in the built loss


@pytest.mark.parametrize("name, options", [("flow_dppo", FlowDPPOOptions), ("sapo", SAPOOptions),
                                           ("diffusion_nft", DiffusionNFTOptions)])
def test_loss_options_class_finds_every_kind_of_loss(name, options):
    assert loss_options_class(name) is options


def test_loss_options_class_names_the_registered_losses():
    with pytest.raises(ConfigError, match="unknown loss; registered: .*flow_grpo.*ppo_clip"):
        loss_options_class("flow_grpoo")
