"""Component options: each registered component (an adapter, a rollout backend, a loss, a model
family, ...) declares its own knobs as a small dataclass, and the recipe sets them in the
component's block (`model.adapter_options`, `rollout.backend_options`, ...). This module binds such a block to
its dataclass and describes a dataclass for `--options`.

A component's options dataclass derives from `ComponentOptions` (`omni_rl.option`), whose
`check()` refuses nothing unless the class overrides it:

    @dataclass
    class LTX2Options(ComponentOptions):
        stg_scale: float = option(0.0, "Spatio-temporal guidance scale of the video stream (0 = off).")

        def check(self) -> None:          # value rules, raise ValueError(message)
            if self.stg_scale < 0:
                raise ValueError("stg_scale=-1: expected >= 0 (0 = off)")

`bind_options(Options, {"stg_scale": 1.0}, "model.adapter_options", "LTX2Pipeline")` returns the
instance, or raises `ConfigError` with one line naming the key, the value and what was
expected: an unknown key lists the component's options, a wrong type names the type, and a
`check()` failure is prefixed with the block's key. Types are checked for the annotation kinds
options use: bool, int, float, str, Optional[...], list[...] and dict.

A float option (and each float of a list) is finite: NaN never is a setting, and infinity passes
most range checks (`> 0`) while meaning nothing (a temperature of inf samples uniformly, a scale
of inf overflows), so both are refused here, for every component at once, before its `check()`
runs. An option for which infinity is a limit with a meaning (a clamp at inf is no clamp)
declares it: `option(None, "...", infinite=True)`.

It imports nothing above `omni_rl.config`.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping, Optional, TypeVar

from omni_rl.errors import ConfigError
from omni_rl.option import ComponentOptions

__all__ = ["allows_infinity", "bind_options", "ComponentOptions", "describe_options", "options_help", "recipe_values", "replace_options",
           "NoOptions", "OptionDoc"]

T = TypeVar("T")


def allows_infinity(options_class: type, name: str) -> bool:
    """Whether the option `name` of `options_class` declares that it may be +-inf."""
    return bool(next(f for f in fields(options_class) if f.name == name).metadata.get("infinite", False))


@dataclass
class NoOptions(ComponentOptions):
    """The options of a component that has none."""


@dataclass(frozen=True)
class OptionDoc:
    name: str
    type: str
    default: Any
    doc: str


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " | ".join(_type_name(a) for a in args) + " | null"
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _block_list_class(tp: Any) -> Optional[type]:
    """X of a field annotated `list[X]` where X is an options dataclass, else None."""
    args = typing.get_args(tp) if typing.get_origin(tp) is list else ()
    return args[0] if args and dataclasses.is_dataclass(args[0]) else None


def _bind_block_list(options_class: type, value: Any, key: str, owner: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r}: expected a list of {options_class.__name__} blocks ({owner})")
    bound = []
    for i, item in enumerate(value):
        if isinstance(item, options_class):
            bound.append(item)
        elif isinstance(item, Mapping):
            bound.append(bind_options(options_class, item, f"{key}[{i}]", owner))
        else:
            raise ConfigError(f"{key}[{i}]={item!r}: expected a mapping, the options of one "
                              f"{options_class.__name__} ({owner})")
    return bound


def _matches(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, Mapping)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _coerce(value: Any, tp: Any) -> Any:
    """An int where a float is declared becomes a float; lists stay lists (YAML gives lists)."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if arg is not type(None) and _matches(value, arg):
                return _coerce(value, arg)
    if isinstance(value, tuple):
        return list(value)
    return value


def bind_options(options_class: type[T], values: Optional[Mapping[str, Any]], key: str, owner: str) -> T:
    """Build `options_class` from a recipe's block `values` (None or {} gives the defaults).

    `key` is the block's config key (`model.adapter_options`), `owner` names the component in messages
    (`adapter LTX2Pipeline`). Raises `ConfigError` with one line on an unknown key, a wrong
    type or a failed `check()`."""
    if not (isinstance(options_class, type) and issubclass(options_class, ComponentOptions)):
        raise TypeError(f"{key} ({owner}): options class {options_class!r} does not derive from "
                        f"omni_rl.option.ComponentOptions; declare it as a ComponentOptions dataclass")
    values = dict(values or {})
    hints = typing.get_type_hints(options_class)
    known = {f.name: f for f in fields(options_class)}
    for name, value in values.items():
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise ConfigError(
                f"{key}.{name}={value!r}: {owner} has no option {name!r}; its options: {listed} "
                f"(`python main_omni.py --options` lists them with their defaults and docs)"
            )
        tp = hints.get(name, Any)
        inner = _block_list_class(tp)
        if inner is not None:  # a list of blocks of their own (a family's teachers): each bound here too
            values[name] = _bind_block_list(inner, value, f"{key}.{name}", owner)
            continue
        if not _matches(value, tp):
            raise ConfigError(f"{key}.{name}={value!r}: expected {_type_name(tp)} ({owner})")
        values[name] = _coerce(value, tp)
    instance = options_class(**values)
    # The component's own rule first: its message says what the option is for.
    try:
        instance.check()
    except (ValueError, OverflowError) as err:
        raise ConfigError(f"{key}.{err}" if not str(err).startswith(key) else str(err)) from None
    for name, value in values.items():  # then what no rule of its own refused: NaN, and infinity
        _check_finite(f"{key}.{name}", value, known[name], owner)
    return instance


def _check_finite(key: str, value: Any, spec: dataclasses.Field, owner: str) -> None:
    """A float (or a list's float) that is NaN, or infinite where the option does not declare
    `infinite`, raises `ConfigError`."""
    floats = value if isinstance(value, list) else [value]
    for number in floats:
        if not isinstance(number, float) or math.isfinite(number):
            continue
        if math.isinf(number) and spec.metadata.get("infinite", False):
            continue
        raise ConfigError(
            f"{key}={value!r}: expected a finite number ({owner}); "
            f"{'NaN is no setting' if math.isnan(number) else 'infinity is not a value this option takes'}: set a "
            f"finite value"
        )


def describe_options(options_class: type) -> list[OptionDoc]:
    """Every option of `options_class`: name, type, default and its documentation line."""
    hints = typing.get_type_hints(options_class)
    out = []
    for f in fields(options_class):
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        out.append(OptionDoc(f.name, _type_name(hints.get(f.name, Any)), default, f.metadata.get("doc", "")))
    return out


def options_help(options_class: type, key: str, owner: str) -> str:
    """The `--options` text of one component: a header line, then one line per option."""
    docs = describe_options(options_class)
    lines = [f"{owner}: options under {key}" + ("" if docs else " (none)")]
    width = max((len(d.name) for d in docs), default=0)
    for d in docs:
        lines.append(f"  {d.name:<{width}}  {d.type} = {d.default!r}  {d.doc}")
    return "\n".join(lines)


def recipe_values(value: Any) -> Any:
    """What a recipe writes for a bound options instance: the mapping of its fields that differ
    from their defaults (a block bound inside one, think_draw's plan loss, the same way); a
    mapping's values likewise; anything else as it is. Binding the result gives the instance back."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)  # type: ignore[misc]
            current = getattr(value, f.name)
            if current != default:
                out[f.name] = recipe_values(current)
        return out
    if isinstance(value, Mapping):
        return {key: recipe_values(item) for key, item in value.items()}
    if isinstance(value, list):  # a list of blocks: the agent loop's tools, each with its tool_options
        return [recipe_values(item) for item in value]
    return value


def replace_options(instance: T, **changes: Any) -> T:
    """A copy of an options instance with some values changed (as `dataclasses.replace`)."""
    return dataclasses.replace(instance, **changes)
