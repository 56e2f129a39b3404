"""Every float option of every registered component is finite unless it declares that infinity
means something there (`option(..., infinite=True)`), refused by `bind_options` for all at once
(issue 45, M3 and item 3): `rollout.sampling_options.temperature=inf` passed the `> 0` check and
sampled uniformly. NaN is refused always. Reward options, which are factory keywords, too."""
from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from omni_rl.algos.rollout_correction import RolloutCorrectionOptions
from omni_rl.cli import main
from omni_rl.compose import OPTION_BLOCKS, load_config
from omni_rl.config.options import allows_infinity, bind_options
from omni_rl.option import ComponentOptions, option
from omni_rl.errors import ConfigError
from omni_rl.logging.heldout_alarm import AlarmOptions
from omni_rl.logging import LoggerOptions
from omni_rl.plugins import load_plugins
from omni_rl.reward.registry import RewardConfigError, check_reward_options
from omni_rl.rollout.sde_window import SdeWindowOptions
from omni_rl.workers.reward_worker import RewardWorkerOptions

TK = "recipe=tiny_qwen3_omni_talker_grpo"


def takes_float(tp) -> bool:
    if tp is float:
        return True
    return any(takes_float(arg) for arg in typing.get_args(tp))


def takes_list(tp) -> bool:
    return typing.get_origin(tp) is list or any(takes_list(arg) for arg in typing.get_args(tp))


def every_float_option():
    load_plugins()
    classes = {RolloutCorrectionOptions, SdeWindowOptions, LoggerOptions, AlarmOptions, RewardWorkerOptions}
    owners = {}
    for block in OPTION_BLOCKS:
        for name in block.registry.names():
            for key, options_class in ((block.block, block.options_class), *block.companions):
                cls = options_class(block.registry.get(name))
                classes.add(cls)
                owners.setdefault(cls, f"{key} of {block.registry.kind} {name}")
    out = []
    for cls in sorted(classes, key=lambda c: c.__qualname__):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if takes_float(hints[f.name]):
                out.append((cls, f.name, owners.get(cls, cls.__name__)))
    return out


FLOAT_OPTIONS = every_float_option()


def test_the_registries_hold_the_float_options_issue_45_names():
    names = {name for _, name, _ in FLOAT_OPTIONS}
    # temperatures, top-p, guidance scales, clips, memories, timeouts: more than forty in all.
    assert {"temperature", "speech_temperature", "top_p", "guidance", "stg_scale", "gpu_memory_utilization",
            "clip_range", "server_timeout_s"} <= names
    assert len(FLOAT_OPTIONS) > 40


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_inf_and_nan_are_refused_where_not_declared(value):
    allowed = []
    for cls, name, owner in FLOAT_OPTIONS:
        values = {name: [value, value] if takes_list(typing.get_type_hints(cls)[name]) else value}
        if allows_infinity(cls, name) and not math.isnan(value):
            allowed.append(name)
            continue
        with pytest.raises(ConfigError) as info:
            bind_options(cls, values, "block", owner)
        # The component's own rule may refuse it first, in its own words; else the finite check does.
        message = str(info.value)
        assert message.startswith(f"block.{name}=") and repr(value) in message, (owner, message)
    # Only kl_clamp declares infinity (a clamp at inf is no clamp, as null is), in each token loss.
    assert set(allowed) == (set() if math.isnan(value) else {"kl_clamp"})


def test_an_option_declared_infinite_binds_inf():
    @dataclasses.dataclass
    class Clamp(ComponentOptions):
        limit: float = option(1.0, "a clamp; inf = none", infinite=True)
        scale: float = option(1.0, "a scale")

    assert bind_options(Clamp, {"limit": math.inf}, "k", "test").limit == math.inf
    with pytest.raises(ConfigError, match=r"^k.limit=nan: expected a finite number \(test\); NaN is no setting"):
        bind_options(Clamp, {"limit": math.nan}, "k", "test")
    with pytest.raises(ConfigError, match=r"^k.scale=inf: expected a finite number \(test\); infinity is not a value"):
        bind_options(Clamp, {"scale": math.inf}, "k", "test")
    assert bind_options(Clamp, {"scale": 1e300}, "k", "test").scale == 1e300  # large but finite is the check's to judge


@pytest.mark.parametrize("override", ["rollout.sampling_options.temperature=inf", "rollout.sampling_options.speech_temperature=inf",
                                      "rollout.sampling_options.top_p=-inf"])
def test_the_talker_recipe_refuses_inf_on_the_command_line(capsys, tmp_path, override):
    assert main([TK, override, "trainer.val_every=0", f"trainer.output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    key, value = override.split("=")
    # The family's own rule words it where it has one (top_p in (0, 1]); else the finite check does.
    assert err in (f"error: {key}={float(value)!r}: expected a finite number (model family TalkerFamily); infinity "
                   f"is not a value this option takes: set a finite value",
                   f"error: {key}={float(value)!r}: expected a finite number > 0",
                   f"error: {key}={float(value)!r}: expected in (0, 1]"), err


def test_the_text_recipe_refuses_an_infinite_temperature():
    with pytest.raises(ConfigError, match=r"^rollout.sampling_options.temperature=inf: expected a finite number"):
        load_config(["recipe=tiny_qwen3_grpo", "rollout.sampling_options.temperature=inf"])


@pytest.mark.parametrize("name, kwargs", [("jpeg_compressibility", {"scale": math.inf}),
                                          ("speech_rate", {"max_wps": math.inf}),
                                          ("http_scorer", {"url": "http://127.0.0.1:1/score", "timeout_s": math.nan})])
def test_reward_options_are_finite(name, kwargs):
    key, value = next((k, v) for k, v in kwargs.items() if isinstance(v, float))
    with pytest.raises(RewardConfigError) as info:
        check_reward_options(name, kwargs)
    assert str(info.value) == f"{name}: {key}={value!r}; expected a finite number: set a finite value"
