"""The text sampling and prompt-length knobs are the model families' options (issue 24): set in
`algo.family_options`, checked at load in one line, listed by `--options model.family=NAME`; the
old flat keys name their new place. Also the diffusion family's `same_noise_in_group` and
`val_num_steps`, which only that family reads."""
from __future__ import annotations

import pytest

from omni_rl.compose import load_config, options_help_for
from omni_rl.errors import ConfigError
from omni_rl.data.prompt_length import PromptLimitOptions
from omni_rl.families.autoregressive import TextFamily, TextFamilyOptions, TextOptions
from omni_rl.families.base import prompt_limits
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.think_draw import ThinkDrawFamily

QWEN3 = "recipe=tiny_qwen3_grpo"
THINK = "recipe=tiny_bagel_think_flowgrpo"


def _one_line_error(overrides) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("override, new, owner", [
    ("rollout.temperature=0.7", "algo.family_options.temperature", "the autoregressive and think_draw families'"),
    ("rollout.max_new_tokens=8", "algo.family_options.max_new_tokens", "the autoregressive and think_draw families'"),
    ("rollout.top_p=0.9", "algo.family_options.top_p", "the autoregressive family's"),
    ("rollout.stop_token_ids=[7]", "algo.family_options.stop_token_ids", "the autoregressive family's"),
    ("data.max_prompt_tokens=100", "algo.family_options.max_prompt_tokens", "the autoregressive family's"),
    ("data.overlong_prompts=drop", "algo.family_options.overlong_prompts", "the autoregressive family's"),
    ("rollout.same_noise_in_group=true", "algo.family_options.same_noise_in_group", "the diffusion and think_draw"),
    ("trainer.val_num_steps=4", "algo.family_options.val_num_steps", "the diffusion and think_draw"),
])
def test_an_old_flat_key_names_its_new_place_in_one_line(override, new, owner):
    old = override.split("=", 1)[0]
    message = _one_line_error([QWEN3, override])
    assert message.startswith(f"{old} moved: set {new} ({owner}"), message


def test_an_old_flat_key_in_a_recipe_file_names_its_new_place(tmp_path):
    recipe = tmp_path / "old_text.yaml"
    recipe.write_text("model:\n  adapter: Qwen3ForCausalLM\n  path: tiny:qwen3\nrollout:\n  max_new_tokens: 16\n")
    message = _one_line_error([f"recipe={recipe}"])
    assert message == ("rollout.max_new_tokens moved: set algo.family_options.max_new_tokens (the autoregressive and "
                       "think_draw families' option) [recipe file old_text.yaml]")


@pytest.mark.parametrize("overrides, expected", [
    ([QWEN3, "algo.family_options.temperature=0"], "algo.family_options.temperature=0.0: expected > 0"),
    ([QWEN3, "algo.family_options.top_p=1.5"], "algo.family_options.top_p=1.5: expected in (0, 1]"),
    ([QWEN3, "algo.family_options.top_p=0"], "algo.family_options.top_p=0.0: expected in (0, 1]"),
    ([QWEN3, "algo.family_options.max_new_tokens=0"], "algo.family_options.max_new_tokens=0: expected >= 1"),
    ([QWEN3, "algo.family_options.stop_token_ids=[a]"], "algo.family_options.stop_token_ids=['a']: expected list[int]"),
    ([QWEN3, "algo.family_options.overlong_prompts=cut"],
     "algo.family_options.overlong_prompts='cut': expected one of error, truncate, drop"),
    ([THINK, "algo.family_options.temperature=-1"], "algo.family_options.temperature=-1.0: expected > 0"),
    ([THINK, "algo.family_options.max_new_tokens=0"], "algo.family_options.max_new_tokens=0: expected >= 1"),
    ([THINK, "algo.family_options.top_p=0.9"], "algo.family_options.top_p=0.9: model family ThinkDrawFamily has no "
                                               "option 'top_p'"),
    (["algo.family_options.val_num_steps=0"], "algo.family_options.val_num_steps=0: expected an integer >= 1"),
    (["algo.family_options.same_noise_in_group=1"], "algo.family_options.same_noise_in_group=1: expected bool"),
    # A text model's knob on a diffusion model is no option of its family.
    (["algo.family_options.temperature=0.7"], "algo.family_options.temperature=0.7: model family DiffusionFamily has "
                                              "no option 'temperature'"),
    ([QWEN3, "algo.family_options.val_num_steps=4"], "algo.family_options.val_num_steps=4: model family TextFamily has "
                                                     "no option 'val_num_steps'"),
])
def test_a_bad_value_in_the_family_block_is_refused_in_one_line(overrides, expected):
    message = _one_line_error(overrides)
    assert message.startswith(expected), message


def test_a_backend_whose_log_probs_renormalise_refuses_a_nucleus_at_load():
    message = _one_line_error([QWEN3, "rollout.backend=vllm", "algo.family_options.top_p=0.9"])
    assert message.startswith("algo.family_options.top_p=0.9: expected 1.0 with rollout.backend=vllm"), message
    load_config([QWEN3, "rollout.backend=server", "algo.family_options.top_p=0.9"])  # its text engine is native


def test_the_bound_options_are_the_recipes_and_the_defaults():
    cfg = load_config([QWEN3, "algo.family_options.stop_token_ids=[7,8]", "algo.family_options.max_prompt_tokens=100",
                       "algo.family_options.overlong_prompts=truncate"])
    options = cfg.algo.family_options
    assert options == TextFamilyOptions(temperature=1.0, top_p=1.0, max_new_tokens=16, stop_token_ids=[7, 8],
                                        max_prompt_tokens=100, overlong_prompts="truncate")
    assert prompt_limits(cfg) is not None and (prompt_limits(cfg).max_prompt_tokens, prompt_limits(cfg).overlong_prompts) \
        == (100, "truncate")
    think = load_config([THINK]).algo.family_options
    assert (think.temperature, think.max_new_tokens, think.plan_policy_loss) == (1.0, 8, "ppo_clip")
    sd3 = load_config(["algo.family_options.same_noise_in_group=true", "algo.family_options.val_num_steps=4"])
    diffusion = sd3.algo.family_options
    assert (diffusion.same_noise_in_group, diffusion.val_num_steps) == (True, 4)
    assert prompt_limits(sd3) == PromptLimitOptions()  # a diffusion model's prompts: the character bound only


@pytest.mark.parametrize("family, listed", [
    ("autoregressive", ["temperature", "top_p", "max_new_tokens", "stop_token_ids", "max_prompt_tokens",
                        "overlong_prompts"]),
    ("think_draw", ["temperature", "max_new_tokens", "plan_policy_loss", "same_noise_in_group", "val_num_steps"]),
    ("diffusion", ["same_noise_in_group", "val_num_steps", "timestep_fraction"]),
])
def test_options_lists_a_familys_options(family, listed):
    text = options_help_for("model.family", family)
    assert text.splitlines()[0].startswith(f"model family {family}: options under algo.family_options"), text
    shown = {line.split()[0] for line in text.splitlines()[1:]}
    assert set(listed) <= shown, text
    if family == "think_draw":
        assert "top_p" not in shown and "stop_token_ids" not in shown
