"""One naming rule for options blocks: `<kind>_options`, read from the schema itself, and the old
names of the renamed blocks fail at load with one line naming the new one."""
from __future__ import annotations

import dataclasses
import typing

import pytest

from omni_rl.compose import OPTION_BLOCKS, load_config
from omni_rl.config.loader import MOVED_BLOCKS
from omni_rl.config.schema import OmniConfig
from omni_rl.errors import ConfigError


def _dict_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys of every dict-typed field of the schema's dataclasses (a list's item class included)."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp
        if typing.get_origin(inner) is list and typing.get_args(inner):
            inner = typing.get_args(inner)[0]
        if typing.get_origin(inner) is dict or inner is dict:
            found.append(prefix + f.name)
        elif dataclasses.is_dataclass(inner):
            found += _dict_fields(inner, prefix + f.name + ".")
    return found


def test_every_options_block_of_the_schema_is_named_kind_options():
    blocks = _dict_fields(OmniConfig)
    assert "reward.rewards.reward_options" in blocks and "model.adapter_options" in blocks, blocks
    assert [b for b in blocks if not b.endswith("_options")] == []


@pytest.mark.parametrize("row", OPTION_BLOCKS, ids=lambda row: row.selector)
def test_a_selected_components_block_is_named_after_its_selector(row):
    name = row.block.removesuffix(".<loss>").rsplit(".", 1)[1]
    assert name == row.selector.rsplit(".", 1)[1] + "_options", (row.selector, row.block)


CASES = [
    ("model.options.max_sequence_length=16", "model.adapter_options.max_sequence_length"),
    ("rollout.options.max_wait_ms=5", "rollout.backend_options.max_wait_ms"),
    ("algo.loss_options.flow_grpo.clip_range=0.1", "algo.policy_loss_options.flow_grpo.clip_range"),
    ("algo.rollout_correction.level=step", "algo.rollout_correction_options.level"),
    ("reward.workers.num_workers=1", "reward.worker_options.num_workers"),
    ("reward.rewards=[{name: brightness, kwargs: {}}]", "reward.rewards[0].reward_options"),
    ("reward.val_rewards=[{name: brightness}, {name: brightness, kwargs: {}}]", "reward.val_rewards[1].reward_options"),
]


def test_every_renamed_block_is_covered():
    old = {case.split("=", 1)[0] for case, _ in CASES}
    covered = {key for key in MOVED_BLOCKS if any(o.startswith(key.split("[]")[0]) for o in old)}
    assert covered == set(MOVED_BLOCKS)


@pytest.mark.parametrize("override, new", CASES)
def test_an_old_block_name_fails_naming_the_new_one(override, new):
    with pytest.raises(ConfigError) as err:
        load_config(["recipe=tiny_sd3_flowgrpo", override])
    message = str(err.value)
    assert "\n" not in message and f"moved: set {new} " in message, message


def test_an_old_block_name_in_a_recipe_fails_naming_the_new_one(tmp_path):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("model:\n  options: {max_sequence_length: 16}\n")
    with pytest.raises(ConfigError, match=r"^model\.options moved: set model\.adapter_options \(.*old\.yaml"):
        load_config([f"recipe={recipe}"])
    recipe.write_text("reward:\n  rewards:\n    - name: brightness\n      kwargs: {}\n")
    with pytest.raises(ConfigError, match=r"^reward\.rewards\[0\]\.kwargs moved: set reward\.rewards\[0\]\.reward_options "):
        load_config([f"recipe={recipe}"])
