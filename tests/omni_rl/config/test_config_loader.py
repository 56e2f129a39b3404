"""Composing a job's config: schema + recipe YAML + `key=value` overrides (omni_rl/config/loader.py).

Every failure must be one `ConfigError` line naming the key (what the CLI prints after `error:`).
Recipes for these tests are written to tmp_path; the shipped ones are checked in
tests/recipes/test_recipes.py.
"""
import dataclasses
import textwrap

import pytest

from omni_rl.compose import load_config
from omni_rl.config import compose_config
from omni_rl.config import OmniConfig, available_recipes
from omni_rl.errors import ConfigError
from omni_rl.config.schema import DataConfig

DEFAULT = OmniConfig.recipe  # the CPU demo, used when no recipe= is given


def load_error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    assert "\n" not in message, f"a ConfigError must be one line, got: {message!r}"
    return message


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """A recipe folder on OMNI_RL_RECIPE_PATH; call it with (name, yaml text)."""
    monkeypatch.setenv("OMNI_RL_RECIPE_PATH", str(tmp_path))

    def write(name: str, text: str):
        path = tmp_path / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


# --- recipes: found, resolved, layered ------------------------------------------------------
def test_default_recipe_loads():
    cfg = compose_config([])
    assert cfg.recipe == DEFAULT
    assert isinstance(cfg, OmniConfig)


def test_unknown_recipe_lists_the_available_ones():
    message = load_error(["recipe=nope"])
    assert "unknown recipe 'nope'" in message
    assert available_recipes(), "the project ships at least one recipe"
    for name in available_recipes():
        assert name in message


def test_a_recipe_that_sets_nothing_gets_the_schema_defaults(recipe_dir):
    recipe_dir("only_prompts", "data:\n  prompts: [a cat]\n")
    cfg = compose_config(["recipe=only_prompts"])
    expected = dataclasses.replace(OmniConfig(), recipe="only_prompts", data=DataConfig(prompts=["a cat"]))
    assert cfg == expected


def test_an_empty_recipe_fails_on_the_missing_prompts_not_on_parsing(recipe_dir):
    recipe_dir("empty", "")
    assert "data.prompts" in load_error(["recipe=empty"])


def test_recipe_beats_schema_and_override_beats_recipe(recipe_dir):
    recipe_dir("layers", """\
        data: {prompts: [a cat]}
        trainer: {total_steps: 3, seed: 7}
        """)
    cfg = compose_config(["recipe=layers"])
    assert (cfg.trainer.total_steps, cfg.trainer.seed) == (3, 7)  # schema says 40, 42
    cfg = compose_config(["recipe=layers", "trainer.total_steps=5"])
    assert (cfg.trainer.total_steps, cfg.trainer.seed) == (5, 7)
    # the order of `recipe=` among the overrides does not matter
    assert compose_config(["trainer.total_steps=5", "recipe=layers"]).trainer.total_steps == 5


def test_recipe_given_as_a_file_path(tmp_path):
    path = tmp_path / "my_job.yaml"
    path.write_text("data: {prompts: [a fox]}\nrollout: {sampling_options: {num_steps: 4}}\n")
    cfg = compose_config([f"recipe={path}"])
    assert cfg.recipe == "my_job"
    assert cfg.rollout.sampling_options["num_steps"] == 4 and cfg.data.prompts == ["a fox"]  # bound by load_config


def test_missing_recipe_file_is_a_config_error(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert str(missing) in load_error([f"recipe={missing}"])


def test_recipe_path_env_adds_a_folder(recipe_dir):
    assert "from_env" not in available_recipes()
    recipe_dir("from_env", "data: {prompts: [a dog]}\ntrainer: {total_steps: 2}\n")
    assert "from_env" in available_recipes()
    assert DEFAULT in available_recipes()  # the project's folder stays on the path
    cfg = compose_config(["recipe=from_env"])
    assert cfg.recipe == "from_env" and cfg.trainer.total_steps == 2


def test_recipe_path_env_folder_wins_over_the_project_folder(recipe_dir):
    path = recipe_dir(DEFAULT, "data: {prompts: [a dog]}\ntrainer: {total_steps: 2}\n")
    assert available_recipes()[DEFAULT] == path
    assert compose_config([]).trainer.total_steps == 2


def test_recipe_with_a_defaults_list_is_rejected(recipe_dir):
    recipe_dir("with_defaults", "defaults: [other]\ndata: {prompts: [a]}\n")
    assert "defaults" in load_error(["recipe=with_defaults"])


def test_recipe_that_is_not_a_mapping_is_rejected(recipe_dir):
    recipe_dir("a_list", "- trainer.total_steps=3\n")
    assert "a_list" in load_error(["recipe=a_list"])


def test_recipe_with_broken_yaml_is_one_line(recipe_dir):
    recipe_dir("broken", "data: {prompts: [a cat\n")
    assert "broken" in load_error(["recipe=broken"])


# --- keys and types -------------------------------------------------------------------------
@pytest.mark.parametrize("override, key", [
    ("trainer.totl_steps=3", "trainer.totl_steps"),
    ("model.lora.rnk=4", "model.lora.rnk"),
    ("rolout.num_steps=4", "rolout"),
])
def test_misspelled_override_key_names_the_full_key(override, key):
    assert key in load_error([override])


def test_misspelled_key_in_a_recipe_names_the_full_key(recipe_dir):
    recipe_dir("typo", "data: {prompts: [a]}\ntrainer: {total_stepz: 3}\n")
    message = load_error(["recipe=typo"])
    assert "trainer.total_stepz" in message and "typo" in message


@pytest.mark.parametrize("override, key, type_word", [
    ("trainer.total_steps=abc", "trainer.total_steps", "int"),
    ("trainer.total_steps=1.5", "trainer.total_steps", "int"),
    ("model.lora.enabled=maybe", "model.lora.enabled", "bool"),
    ("data.prompts=a cat", "data.prompts", "list"),
    ("model.path=null", "model.path", "optional"),
])
def test_wrong_type_names_the_key_and_the_type(override, key, type_word):
    message = load_error([override])
    assert key in message and type_word in message.lower()


def test_a_sampling_option_of_the_wrong_type_names_the_key_and_the_type():
    with pytest.raises(ConfigError) as info:
        load_config(["rollout.sampling_options.noise_level=high"])
    assert "rollout.sampling_options.noise_level" in str(info.value) and "float" in str(info.value).lower()


def test_wrong_type_in_a_recipe_names_the_key(recipe_dir):
    recipe_dir("bad_type", "data: {prompts: [a]}\ntrainer: {total_steps: many}\n")
    message = load_error(["recipe=bad_type"])
    assert "trainer.total_steps" in message and "many" in message


@pytest.mark.parametrize("override", ["+trainer.total_steps=3", "+brand_new_key=1", "++trainer.seed=1"])
def test_adding_keys_with_plus_is_rejected(override):
    message = load_error([override])
    assert override in message


def test_deleting_a_key_is_rejected():
    assert "trainer.total_steps" in load_error(["~trainer.total_steps"])


# --- cross-field rules run at load ----------------------------------------------------------
@pytest.mark.parametrize("overrides, key", [
    (["rollout.sampling_options.num_steps=4", "rollout.sampling_options.sde_window_size=5"], "rollout.sampling_options.sde_window_size"),
    (["rollout.sampling_options.num_steps=6", "rollout.sampling_options.sde_window_range=[2,8]"], "rollout.sampling_options.sde_window_range"),
    (["trainer.prompts_per_step=3", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=8"],
     "trainer.mini_batch_size"),
    (["trainer.mini_batch_size=16", "trainer.micro_batch_size=6"], "trainer.micro_batch_size"),
    (["algo.kl_coef=0.04", "model.lora.enabled=false"], "algo.kl_coef"),
    (["model.dtype=fp16"], "model.dtype"),
])
def test_inconsistent_overrides_fail_at_load_naming_the_key(overrides, key):
    # The sampling block's rules are its own (bound by the composition root): load_config runs them.
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_consistent_overrides_load():
    cfg = load_config([
        "rollout.sampling_options.num_steps=8", "rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_range=[0,4]",
        "trainer.prompts_per_step=3", "trainer.samples_per_prompt=4", "trainer.mini_batch_size=6",
        "trainer.micro_batch_size=3", "algo.kl_coef=0.04", "model.dtype=bfloat16",
    ])
    assert cfg.rollout.sampling_options.sde_window_range == [0, 4] and cfg.trainer.micro_batch_size == 3
    assert cfg.model.dtype == "bfloat16" and cfg.algo.kl_coef == pytest.approx(0.04)
