"""Each model family's sampling knobs are its `Sampling` options (issue 39), set in
`rollout.sampling_options`; its prompt-length knobs are its options (issue 24), set in
`algo.family_options`. Both are checked at load in one line and listed by `--options
model.family=NAME`; the old keys name their new place, and a config saved before the move reads
in the new layout. Also the diffusion family's `same_noise_in_group` and `val_num_steps`, which
only that family reads."""
from __future__ import annotations

import pytest

from omni_rl.compose import load_config, options_help_for
from omni_rl.data.prompt_length import PromptLimitOptions
from omni_rl.families.autoregressive import TextFamily, TextFamilyOptions
from omni_rl.families.base import prompt_limits
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.families.sampling import DiffusionSampling, TextSampling, ThinkDrawSampling
from omni_rl.families.think_draw import ThinkDrawFamily
from tests.config_errors import load_error

QWEN3 = "recipe=tiny_qwen3_grpo"
THINK = "recipe=tiny_bagel_think_flowgrpo"


@pytest.mark.parametrize("override, new, owner", [
    ("rollout.temperature=0.7", "rollout.sampling_options.temperature", "the autoregressive, talker, think_draw and "
                                                                        "write_draw families' sampling"),
    ("rollout.max_new_tokens=8", "rollout.sampling_options.max_new_tokens", "the autoregressive, talker, think_draw"),
    ("rollout.top_p=0.9", "rollout.sampling_options.top_p", "the autoregressive and talker families' sampling"),
    ("rollout.stop_token_ids=[7]", "rollout.sampling_options.stop_token_ids", "the autoregressive and talker families'"),
    ("algo.family_options.temperature=0.7", "rollout.sampling_options.temperature", "the autoregressive, talker"),
    ("algo.family_options.top_p=0.9", "rollout.sampling_options.top_p", "the autoregressive and talker families'"),
    ("rollout.height=64", "rollout.sampling_options.height", "the diffusion, think_draw and write_draw families' sampling"),
    ("rollout.sde_window_schedule=random", "rollout.sampling_options.sde_window_schedule", "the diffusion, think_draw"),
    ("rollout.sde_window_options.tau=2", "rollout.sampling_options.sde_window_options.tau", "the diffusion, think_draw"),
    ("rollout.sde_window_tau=2", "rollout.sampling_options.sde_window_options.tau", "the SDE window schedules'"),
    ("data.max_prompt_tokens=100", "algo.family_options.max_prompt_tokens", "the autoregressive family's"),
    ("data.overlong_prompts=drop", "algo.family_options.overlong_prompts", "the autoregressive family's"),
    ("rollout.same_noise_in_group=true", "algo.family_options.same_noise_in_group", "the diffusion and think_draw"),
    ("trainer.val_num_steps=4", "algo.family_options.val_num_steps", "the diffusion and think_draw"),
])
def test_an_old_flat_key_names_its_new_place_in_one_line(override, new, owner):
    old = override.split("=", 1)[0]
    message = load_error(QWEN3, override)
    assert message.startswith(f"{old} moved: set {new} ({owner}"), message


def test_an_old_flat_key_in_a_recipe_file_names_its_new_place(tmp_path):
    recipe = tmp_path / "old_text.yaml"
    recipe.write_text("model:\n  adapter: Qwen3ForCausalLM\n  path: tiny:qwen3\nrollout:\n  max_new_tokens: 16\n")
    message = load_error(f"recipe={recipe}")
    assert message == ("rollout.max_new_tokens moved: set rollout.sampling_options.max_new_tokens (the autoregressive, "
                       "talker, think_draw and write_draw families' sampling option) [recipe file old_text.yaml]")
    recipe.write_text("model:\n  adapter: Qwen3ForCausalLM\n  path: tiny:qwen3\nalgo:\n  family_options:\n"
                      "    top_p: 0.9\n")
    assert load_error(f"recipe={recipe}").startswith(
        "algo.family_options.top_p moved: set rollout.sampling_options.top_p (")
    recipe.write_text("rollout:\n  num_steps: 8\n")
    assert load_error(f"recipe={recipe}").startswith(
        "rollout.num_steps moved: set rollout.sampling_options.num_steps (")


def test_a_config_saved_before_the_move_reads_in_the_new_layout():
    from omni_rl.config.loader import upgrade_saved_config
    saved = {"rollout": {"backend": "native", "height": 64, "width": 32, "num_steps": 6, "sde_window_options": {},
                         "sde_window_range": [0, 4]},
             "algo": {"family_options": {"temperature": 0.5, "val_num_steps": 3}}}
    upgraded = upgrade_saved_config(saved)
    # What differs from the old defaults moves (32 and 6 were the defaults), the rest stays.
    assert upgraded["rollout"] == {"backend": "native", "sampling_options": {"height": 64, "sde_window_range": [0, 4],
                                                                            "temperature": 0.5}}
    assert upgraded["algo"] == {"family_options": {"val_num_steps": 3}}
    assert saved["rollout"]["height"] == 64  # the input is left as it was
    current = {"rollout": {"sampling_options": {"height": 64}}}
    assert upgrade_saved_config(current) == current


@pytest.mark.parametrize("overrides, expected", [
    ([QWEN3, "rollout.sampling_options.temperature=0"], "rollout.sampling_options.temperature=0.0: expected > 0"),
    ([QWEN3, "rollout.sampling_options.top_p=1.5"], "rollout.sampling_options.top_p=1.5: expected in (0, 1]"),
    ([QWEN3, "rollout.sampling_options.top_p=0"], "rollout.sampling_options.top_p=0.0: expected in (0, 1]"),
    ([QWEN3, "rollout.sampling_options.max_new_tokens=0"], "rollout.sampling_options.max_new_tokens=0: expected >= 1"),
    ([QWEN3, "rollout.sampling_options.stop_token_ids=[a]"], "rollout.sampling_options.stop_token_ids=['a']: expected list[int]"),
    ([QWEN3, "algo.family_options.overlong_prompts=cut"],
     "algo.family_options.overlong_prompts='cut': expected one of error, truncate, drop"),
    ([THINK, "rollout.sampling_options.temperature=-1"], "rollout.sampling_options.temperature=-1.0: expected > 0"),
    ([THINK, "rollout.sampling_options.max_new_tokens=0"], "rollout.sampling_options.max_new_tokens=0: expected >= 1"),
    ([THINK, "rollout.sampling_options.top_p=0.9"], "rollout.sampling_options.top_p=0.9: model family ThinkDrawFamily has no "
                                               "option 'top_p'"),
    (["algo.family_options.val_num_steps=0"], "algo.family_options.val_num_steps=0: expected an integer >= 1"),
    (["algo.family_options.same_noise_in_group=1"], "algo.family_options.same_noise_in_group=1: expected bool"),
    # A text model's knob on a diffusion model is no option of its family.
    (["rollout.sampling_options.temperature=0.7"], "rollout.sampling_options.temperature=0.7: model family DiffusionFamily has "
                                              "no option 'temperature'"),
    ([QWEN3, "algo.family_options.val_num_steps=4"], "algo.family_options.val_num_steps=4: model family TextFamily has "
                                                     "no option 'val_num_steps'"),
])
def test_a_bad_value_in_the_family_block_is_refused_in_one_line(overrides, expected):
    message = load_error(*overrides)
    assert message.startswith(expected), message


def test_a_backend_whose_log_probs_renormalise_refuses_a_nucleus_at_load():
    message = load_error(QWEN3, "rollout.backend=vllm", "rollout.sampling_options.top_p=0.9")
    assert message.startswith("rollout.sampling_options.top_p=0.9: expected 1.0 with rollout.backend=vllm"), message
    load_config([QWEN3, "rollout.backend=server", "rollout.sampling_options.top_p=0.9"])  # its text engine is native


def test_the_bound_options_are_the_recipes_and_the_defaults():
    cfg = load_config([QWEN3, "rollout.sampling_options.stop_token_ids=[7,8]", "algo.family_options.max_prompt_tokens=100",
                       "algo.family_options.overlong_prompts=truncate"])
    options = cfg.algo.family_options
    assert options == TextFamilyOptions(max_prompt_tokens=100, overlong_prompts="truncate")
    assert cfg.rollout.sampling_options == TextSampling(temperature=1.0, top_p=1.0, max_new_tokens=16, stop_token_ids=[7, 8])
    assert prompt_limits(cfg) is not None and (prompt_limits(cfg).max_prompt_tokens, prompt_limits(cfg).overlong_prompts) \
        == (100, "truncate")
    think = load_config([THINK])
    assert (think.rollout.sampling_options.temperature, think.rollout.sampling_options.max_new_tokens,
            think.algo.family_options.plan_policy_loss) == (1.0, 8, "ppo_clip")
    assert isinstance(think.rollout.sampling_options, ThinkDrawSampling) and think.rollout.sampling_options.num_steps == 6
    sd3 = load_config(["algo.family_options.same_noise_in_group=true", "algo.family_options.val_num_steps=4"])
    diffusion = sd3.algo.family_options
    assert (diffusion.same_noise_in_group, diffusion.val_num_steps) == (True, 4)
    assert prompt_limits(sd3) == PromptLimitOptions()  # a diffusion model's prompts: the character bound only


@pytest.mark.parametrize("family, listed", [
    ("autoregressive", ["temperature", "top_p", "max_new_tokens", "stop_token_ids", "max_prompt_tokens",
                        "overlong_prompts"]),
    ("think_draw", ["temperature", "max_new_tokens", "plan_policy_loss", "same_noise_in_group", "val_num_steps"]),
    ("diffusion", ["same_noise_in_group", "val_num_steps", "timestep_fraction", "height", "num_steps", "kernel",
                   "sde_window_options"]),
])
def test_options_lists_a_familys_options(family, listed):
    text = options_help_for("model.family", family)
    assert text.splitlines()[0].startswith(f"model family {family}: options under algo.family_options"), text
    shown = {line.split()[0] for line in text.splitlines()[1:]}
    assert set(listed) <= shown, text
    if family == "think_draw":
        assert "top_p" not in shown and "stop_token_ids" not in shown
    # The family's sampling block is listed after its options, under its own header.
    assert f"model family {family}: options under rollout.sampling_options" in text, text


def test_the_sampling_block_is_the_familys_own_class():
    assert (DiffusionFamily.Sampling, TextFamily.Sampling, ThinkDrawFamily.Sampling) == (
        DiffusionSampling, TextSampling, ThinkDrawSampling)
    cfg = load_config(["rollout.sampling_options.num_steps=4", "rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_range=null",
                       "rollout.sampling_options.sde_window_schedule=progressive",
                       "rollout.sampling_options.sde_window_options.tau=2"])
    sampling = cfg.rollout.sampling_options
    assert type(sampling) is DiffusionSampling and (sampling.num_steps, sampling.sde_window_size) == (4, 2)
    assert sampling.sde_window_options.tau == 2 and sampling.height == 32  # the recipe's
    message = load_error("rollout.sampling_options.sde_window_options.tau=2")
    assert message.startswith("rollout.sampling_options.sde_window_options.tau=2: expected 1 (its default) with "
                              "rollout.sampling_options.sde_window_schedule=fixed"), message
    message = load_error(QWEN3, "rollout.sampling_options.height=64")
    assert message.startswith("rollout.sampling_options.height=64: model family TextFamily has no option 'height'"), message
