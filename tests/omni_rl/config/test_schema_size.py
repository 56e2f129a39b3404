"""The flat schema holds only what every run reads (issue 24): a budget on its field count, and
no registered component's name in `config/validate.py` (a component's rules live with it).

Fields are counted recursively over every dataclass of `omni_rl/config/schema.py` reachable from
`OmniConfig`, section fields and `lora` included, each dataclass once (`reward.rewards` and
`reward.val_rewards` share `RewardItemConfig`).
"""
from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from omni_rl.algos import ADVANTAGE_ESTIMATORS, DIFFUSION_KL, STEP_KERNELS
from omni_rl.compose import OPTION_BLOCKS
from omni_rl.config import schema
from omni_rl.families import MODEL_FAMILIES
from omni_rl.plugins import load_plugins

VALIDATE = Path(schema.__file__).with_name("validate.py")
# The whole schema's budget (issue 24), and the part outside `AlgoConfig` (which keeps <= 10 of
# its own): 90 less one, so the whole keeps room for one more field (the part outside gained
# `data.allow_paths_outside` after the budget was first drawn), plus `model.compile_options` (issue
# 44: the model's compilation, one block for every adapter).
TOTAL_BUDGET = 100
NON_ALGO_BUDGET = 90


def _dataclasses_in(cls: type, seen: dict[type, None]) -> dict[type, None]:
    seen[cls] = None
    for tp in typing.get_type_hints(cls).values():
        for inner in (tp, *typing.get_args(tp), *(a for arg in typing.get_args(tp) for a in typing.get_args(arg))):
            if dataclasses.is_dataclass(inner) and inner not in seen:
                _dataclasses_in(inner, seen)
    return seen


def field_counts() -> dict[str, int]:
    return {cls.__name__: len(dataclasses.fields(cls)) for cls in _dataclasses_in(schema.OmniConfig, {})}


def test_the_counter_sees_every_dataclass_of_the_schema():
    declared = {name for name, obj in vars(schema).items() if dataclasses.is_dataclass(obj) and obj.__module__ == schema.__name__}
    assert set(field_counts()) == declared


def test_the_schema_outside_algo_keeps_its_budget():
    counts = field_counts()
    outside = sum(n for name, n in counts.items() if name != "AlgoConfig")
    assert outside <= NON_ALGO_BUDGET, counts


def test_the_whole_schema_keeps_its_budget():
    counts = field_counts()
    assert sum(counts.values()) <= TOTAL_BUDGET, counts


def _names_in_validate(names) -> list[str]:
    source = VALIDATE.read_text()
    return sorted({part for name in names for part in name.split("/") if re.search(rf"\b{re.escape(part)}\b", source)})


def test_no_adapter_backend_engine_or_pipeline_is_named_in_validate():
    load_plugins(())
    named = {block.selector: _names_in_validate(block.registry.names()) for block in OPTION_BLOCKS}
    assert all(not names for names in named.values()), named


def test_no_loss_kernel_estimator_or_family_is_named_in_validate():
    losses = [n for family in MODEL_FAMILIES.names() for n in MODEL_FAMILIES.get(family).losses.names()]
    registries = [ADVANTAGE_ESTIMATORS.names(), STEP_KERNELS.names(), DIFFUSION_KL.names(), MODEL_FAMILIES.names(), losses]
    assert _names_in_validate([n for names in registries for n in names]) == []
