"""The talker's speech knobs are its `Sampling` (`TalkerSampling`, set in
`rollout.sampling_options`), as every other family's sampling knobs are: checked at load in one
line naming the value, refused on a family that does not speak, their old keys under
`algo.family_options` naming the new ones, and a config saved before the move read in the new
layout."""
from __future__ import annotations

import math

import pytest
import yaml

from omni_rl.compose import load_config
from omni_rl.config.loader import to_yaml, upgrade_saved_config
from omni_rl.families.sampling import TalkerSampling
from omni_rl.families.talker import TalkerFamily
from omni_rl.trainer.run_dir import config_changes
from tests.config_errors import load_error

TALKER = "recipe=tiny_qwen3_omni_talker_grpo"
QWEN3 = "recipe=tiny_qwen3_grpo"
OWNER = "the talker family's sampling option"


@pytest.mark.parametrize("name, value", [("speech_temperature", "0.9"), ("max_frames", "12")])
def test_an_old_family_key_names_its_new_place_in_one_line(name, value):
    override = f"algo.family_options.{name}={value}"
    assert load_error(TALKER, override) == (
        f"algo.family_options.{name} moved: set rollout.sampling_options.{name} ({OWNER}) [override {override!r}]")
    # Removing it (`~key`, as a recipe for another stage would) names the new place too.
    assert load_error(TALKER, f"~algo.family_options.{name}").startswith(
        f"algo.family_options.{name} moved: set rollout.sampling_options.{name} ({OWNER})")


def test_an_old_family_key_in_a_recipe_file_names_its_new_place(tmp_path):
    recipe = tmp_path / "old_talker.yaml"
    recipe.write_text("model:\n  adapter: Qwen3OmniMoeForConditionalGeneration\n  stage: talker\n"
                      "  path: tiny:qwen3_omni_talker\nalgo:\n  family_options:\n    max_frames: 16\n")
    assert load_error(f"recipe={recipe}") == (
        f"algo.family_options.max_frames moved: set rollout.sampling_options.max_frames ({OWNER}) "
        f"[recipe file old_talker.yaml]")


@pytest.mark.parametrize("values, expected", [
    ({"speech_temperature": 0.0}, "speech_temperature=0.0: expected a finite number > 0"),
    ({"speech_temperature": -0.5}, "speech_temperature=-0.5: expected a finite number > 0"),
    ({"speech_temperature": math.inf}, "speech_temperature=inf: expected a finite number > 0"),
    ({"max_frames": 0}, "max_frames=0: expected >= 1"),
    # The answer's knobs are the text family's, checked by the same class.
    ({"top_p": 0.0}, "top_p=0.0: expected in (0, 1]"),
    ({"max_new_tokens": 0}, "max_new_tokens=0: expected >= 1"),
])
def test_talker_sampling_check_names_the_bad_value(values, expected):
    with pytest.raises(ValueError) as err:
        TalkerSampling(**values).check()
    assert str(err.value) == expected
    TalkerSampling().check()  # the defaults pass


@pytest.mark.parametrize("override, expected", [
    ("rollout.sampling_options.speech_temperature=0", "rollout.sampling_options.speech_temperature=0.0: expected a "
                                                      "finite number > 0"),
    ("rollout.sampling_options.max_frames=0", "rollout.sampling_options.max_frames=0: expected >= 1"),
])
def test_a_bad_speech_knob_is_refused_at_load_in_one_line(override, expected):
    message = load_error(TALKER, override)
    assert message.startswith(expected), message


def test_the_talker_samples_with_its_own_class_and_the_recipes_values():
    assert TalkerFamily.Sampling is TalkerSampling
    cfg = load_config([TALKER, "rollout.sampling_options.speech_temperature=0.8"])
    sampling = cfg.rollout.sampling_options
    assert type(sampling) is TalkerSampling
    assert (sampling.speech_temperature, sampling.max_frames, sampling.max_new_tokens) == (0.8, 16, 6)
    # The family's options keep only what is not sampling.
    assert not {"speech_temperature", "max_frames"} & set(vars(cfg.algo.family_options))
    # A model that does not speak has no speech knobs.
    message = load_error(QWEN3, "rollout.sampling_options.max_frames=16")
    assert message.startswith("rollout.sampling_options.max_frames=16: model family TextFamily has no option "
                              "'max_frames'"), message


def _saved_before_the_move(cfg) -> dict:
    """`cfg`'s config.yaml as a run wrote it before the move: the speech knobs (those that differ
    from their defaults) under algo.family_options."""
    tree = yaml.safe_load(to_yaml(cfg))
    sampling, family = tree["rollout"]["sampling_options"], tree["algo"]["family_options"]
    for name in ("speech_temperature", "max_frames"):
        if name in sampling:
            family[name] = sampling.pop(name)
    return tree


def test_a_talker_config_saved_before_the_move_reads_in_the_new_layout(tmp_path):
    cfg = load_config([TALKER, "rollout.sampling_options.speech_temperature=0.9"])
    saved = _saved_before_the_move(cfg)
    assert saved["algo"]["family_options"] == {"speech_temperature": 0.9, "max_frames": 16}
    upgraded = upgrade_saved_config(saved)
    assert upgraded["rollout"]["sampling_options"] == {"max_new_tokens": 6, "speech_temperature": 0.9,
                                                       "max_frames": 16}
    assert upgraded["algo"]["family_options"] == {}
    assert saved["algo"]["family_options"]["max_frames"] == 16  # the input is left as it was
    # Resuming from such a checkpoint sees the same config, and a real change is still named.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    assert config_changes(path, to_yaml(cfg)) == []
    saved["algo"]["family_options"]["max_frames"] = 12
    path.write_text(yaml.safe_dump(saved))
    assert config_changes(path, to_yaml(cfg)) == ["rollout.sampling_options.max_frames: 12 -> 16"]
