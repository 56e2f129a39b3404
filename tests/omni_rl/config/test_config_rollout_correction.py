"""The rollout correction's keys (algo.rollout_correction_options: level, cap, mode): values checked by their options class,
the level against the model's family by omni_rl.compose, at config load."""
import pytest

from omni_rl.algos.rollout_correction import ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES
from omni_rl.compose import load_config
from tests.config_errors import load_error

TEXT = ["recipe=tiny_qwen3_grpo"]


def test_the_default_is_off_and_the_family_levels_load():
    assert load_config([]).algo.rollout_correction_options.level == "none"
    for overrides in (["algo.rollout_correction_options.level=step"], ["algo.rollout_correction_options.level=sequence"],
                      [*TEXT, "algo.rollout_correction_options.level=token"], [*TEXT, "algo.rollout_correction_options.level=sequence", "algo.rollout_correction_options.mode=mask"]):
        load_config(overrides)


def test_step_on_a_text_model_fails_naming_the_levels_it_takes():
    message = load_error(*TEXT, "algo.rollout_correction_options.level=step")
    assert message.startswith("algo.rollout_correction_options.level='step': expected none, token or sequence for model.adapter=")
    assert "of family autoregressive" in message and "diffusion: step, sequence" in message


def test_token_on_a_diffusion_model_fails_naming_the_levels_it_takes():
    message = load_error("algo.rollout_correction_options.level=token")
    assert message.startswith("algo.rollout_correction_options.level='token': expected none, step or sequence for model.adapter=")
    assert "of family diffusion" in message and "autoregressive: token, sequence" in message


@pytest.mark.parametrize("override, start", [
    ("algo.rollout_correction_options.level=tokens", "algo.rollout_correction_options.level='tokens': expected one of none, token, sequence, step"),
    ("algo.rollout_correction_options.mode=clip", "algo.rollout_correction_options.mode='clip': expected one of truncate"),
    ("algo.rollout_correction_options.cap=0.5", "algo.rollout_correction_options.cap=0.5: expected a finite value >= 1"),
    ("algo.rollout_correction_options.cap=inf", "algo.rollout_correction_options.cap=inf: expected a finite value >= 1"),
])
def test_bad_values_name_the_key_the_value_and_the_choices(override, start):
    assert load_error(override).startswith(start)


def test_bypass_leaves_nothing_to_correct():
    message = load_error("algo.rollout_correction_options.level=step", "algo.old_logprob_mode=bypass")
    assert message.startswith("algo.old_logprob_mode='bypass': expected auto or recompute with algo.rollout_correction_options.level=step")
    assert "set algo.old_logprob_mode=auto or algo.rollout_correction_options.level=none" in message


def test_the_config_takes_every_level_and_mode_of_the_helper():
    # validate.py (below algos/ in the layers) keeps its own lists; they must not drift apart.
    text_levels = ("none", "token", "sequence")
    diffusion_levels = ("step",)
    assert set(ROLLOUT_IS_LEVELS) == set(text_levels + diffusion_levels)
    for level in diffusion_levels:
        load_config([f"algo.rollout_correction_options.level={level}"])
    for level in text_levels:
        load_config([*TEXT, f"algo.rollout_correction_options.level={level}"])
    for mode in ROLLOUT_IS_MODES:
        load_config(["algo.rollout_correction_options.level=step", f"algo.rollout_correction_options.mode={mode}"])
