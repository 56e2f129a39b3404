"""Every shipped recipe loads, validates, and names only things that exist.

Like torchtune's config tests: each YAML in recipes/ is checked against the schema (its keys)
and against the registries (its adapter, rewards, kernel, advantage, policy loss, KL form), so a
recipe cannot rot silently when a name changes.
"""
import dataclasses
import inspect
import typing

import pytest
from omegaconf import OmegaConf

from omni_rl.algos import ADVANTAGE_ESTIMATORS, DIFFUSION_KL, STEP_KERNELS
from omni_rl.compose import load_config
from omni_rl.config import OmniConfig, available_recipes
from omni_rl.config.loader import PROJECT_ROOT
from omni_rl.families import MODEL_FAMILIES
from omni_rl.models import ADAPTERS
from omni_rl.models.registry import adapter_key
from omni_rl.plugins import load_plugins
from omni_rl.reward import REWARDS

# Only the project's own recipes: a user's OMNI_RL_RECIPE_PATH is not under test here.
PROJECT_RECIPES = {name: path for name, path in available_recipes().items() if path.parent == PROJECT_ROOT / "recipes"}


def unknown_keys(node, schema, prefix: str = "") -> list[str]:
    """Dotted keys of the plain YAML `node` that the (dataclass) `schema` type does not have."""
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin is typing.Union:  # Optional[X]
        return unknown_keys(node, next(a for a in args if a is not type(None)), prefix)
    if dataclasses.is_dataclass(schema) and isinstance(node, dict):
        hints = typing.get_type_hints(schema)
        found = []
        for key, value in node.items():
            if key not in hints:
                found.append(f"{prefix}{key}")
            else:
                found += unknown_keys(value, hints[key], f"{prefix}{key}.")
        return found
    if origin is list and args and isinstance(node, list):
        return [k for i, item in enumerate(node) for k in unknown_keys(item, args[0], f"{prefix}{i}.")]
    return []  # a leaf, or dict[str, Any] (reward kwargs): free-form


def test_unknown_keys_finds_misspellings():
    node = {"trainer": {"total_stepz": 1, "seed": 2}, "reward": {"rewards": [{"name": "x", "wieght": 1}]},
            "model": {"lora": {"rnk": 4}}, "plugins": ["a"], "extra": 1}
    assert unknown_keys(node, OmniConfig) == [
        "trainer.total_stepz", "reward.rewards.0.wieght", "model.lora.rnk", "extra",
    ]


def test_the_project_ships_recipes():
    assert OmniConfig.recipe in PROJECT_RECIPES


@pytest.fixture(scope="module")
def plugins_loaded():
    load_plugins()


@pytest.mark.parametrize("name", sorted(PROJECT_RECIPES))
class TestRecipe:
    def test_only_schema_keys(self, name):
        node = OmegaConf.to_container(OmegaConf.load(PROJECT_RECIPES[name]))
        assert isinstance(node, dict), f"recipe {name} must be a mapping"
        assert unknown_keys(node, OmniConfig) == []

    def test_loads_and_validates(self, name):
        cfg = load_config([f"recipe={name}"])  # validate_config runs inside
        assert isinstance(cfg, OmniConfig) and cfg.recipe == name

    def test_names_registered_components(self, name, plugins_loaded):
        cfg = load_config([f"recipe={name}"])
        load_plugins(cfg.plugins)
        assert adapter_key(cfg.model.adapter, cfg.model.stage) in ADAPTERS, ADAPTERS.names()
        losses = MODEL_FAMILIES.get(ADAPTERS.get(adapter_key(cfg.model.adapter, cfg.model.stage)).family).losses
        assert cfg.algo.policy_loss in losses, losses.names()
        assert cfg.algo.advantage in ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATORS.names()
        kl_form = getattr(cfg.algo.family_options, "kl_form", "exact")  # text families have none
        assert kl_form in DIFFUSION_KL, DIFFUSION_KL.names()
        kernel = getattr(cfg.rollout.sampling_options, "kernel", "sde")  # text families sample no kernel
        assert kernel in STEP_KERNELS, STEP_KERNELS.names()

    def test_rewards_are_registered_and_take_their_options(self, name, plugins_loaded):
        cfg = load_config([f"recipe={name}"])
        load_plugins(cfg.plugins)
        assert cfg.reward.rewards
        for item in [*cfg.reward.rewards, *(cfg.reward.val_rewards or [])]:
            assert item.name in REWARDS, REWARDS.names()
            # bind, not call: building a real reward may load a model
            inspect.signature(REWARDS.get(item.name)).bind(**item.reward_options)


REAL_RECIPES = sorted(name for name in PROJECT_RECIPES
                      if not str(OmegaConf.load(PROJECT_RECIPES[name]).model.path).startswith("tiny:"))


@pytest.mark.parametrize("name", REAL_RECIPES)
def test_a_real_recipe_names_its_data_and_holds_some_out(name):
    # Issue 38, 3.7: the header says which public file the recipe reads, its format and the
    # override ("Data"), and validation runs on prompts the run does not train on.
    header = PROJECT_RECIPES[name].read_text().split("\nmodel:")[0]
    assert "\n# Data" in header and "data.prompt_file=" in header, f"{name}: no 'Data:' paragraph with its override"
    cfg = load_config([f"recipe={name}"])
    assert cfg.data.val_prompt_file is not None, f"{name}: no held-out data.val_prompt_file"
    assert cfg.data.val_prompt_file != cfg.data.prompt_file


def test_a_real_recipe_without_its_data_says_where_to_get_it(capsys):
    from omni_rl.cli import main

    assert main(["recipe=sd35_medium_flowgrpo_geneval_lora"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: data.prompt_file='data/flow_grpo/geneval/train_metadata.jsonl' does not exist")
    assert err.endswith("(recipes/NAME.yaml, under 'Data:') which public file it reads, its format and where to get "
                        "it; then set data.prompt_file=PATH")


def test_the_geneval_recipe_trains_on_partial_credit_and_validates_on_the_verdict():
    cfg = load_config(["recipe=sd35_medium_flowgrpo_geneval_lora"])
    assert [(r.name, r.reward_options["score"]) for r in cfg.reward.rewards] == [("geneval", "partial")]
    assert [(r.name, r.reward_options["score"]) for r in cfg.reward.val_rewards] == [("geneval", "correct")]
    # Flow-GRPO's geneval_sd3: 10 steps, 40 to evaluate, CFG 4.5, 512 px, 48 prompts x 24, KL 0.04.
    assert (cfg.rollout.sampling_options.num_steps, cfg.algo.family_options.val_num_steps, cfg.rollout.sampling_options.guidance_scale) == (10, 40, 4.5)
    assert (cfg.rollout.sampling_options.height, cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt) == (512, 48, 24)
    assert (cfg.trainer.mini_batch_size, cfg.algo.kl_coef, cfg.model.adapter_options.max_sequence_length) == (576, 0.04, 128)


@pytest.mark.parametrize("name", sorted(PROJECT_RECIPES))
def test_a_recipe_header_states_its_compilation_choice_and_the_recipe_keeps_it(name):
    # Issue 44: compilation is off where it does not pay, on where it does, each recipe's choice
    # stated in its header (the comment block above the first key).
    lines = PROJECT_RECIPES[name].read_text().splitlines()
    header = lines[:next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))]
    stated = [line for line in header if line.startswith("# Compilation: ")]
    assert len(stated) == 1, f"{name}: the header needs one '# Compilation: on|off ...' line"
    on = stated[0].startswith("# Compilation: on")
    assert on or stated[0].startswith("# Compilation: off"), stated[0]
    assert load_config([f"recipe={name}"]).model.compile_options.enabled is on, f"{name}: header says {stated[0]!r}"
