"""What binding reads of an options class is declared: every registered component's options
class (its entry's `options_class`, a loss's or a family's `Options`) derives from
`ComponentOptions`, whose `check()` the binding calls, and a class that does not is refused."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from omni_rl.compose import OPTION_BLOCKS
from omni_rl.config.options import NoOptions, bind_options
from omni_rl.option import ComponentOptions, option


@pytest.mark.parametrize("row", OPTION_BLOCKS, ids=lambda row: row.selector)
def test_every_registered_components_options_derive_from_the_base(row):
    classes = {name: row.options_class(row.registry.get(name)) for name in row.registry.names()}
    assert classes, row.selector
    assert {name: cls for name, cls in classes.items() if not issubclass(cls, ComponentOptions)} == {}


def test_the_base_refuses_nothing_and_a_plain_dataclass_is_refused():
    @dataclass
    class Plain:
        scale: float = option(1.0, "a scale")

    @dataclass
    class Declared(ComponentOptions):
        scale: float = option(1.0, "a scale")

    assert bind_options(Declared, {"scale": -3}, "k", "test") == Declared(scale=-3.0)
    assert bind_options(NoOptions, {}, "k", "test") == NoOptions()
    with pytest.raises(TypeError, match=r"^k \(test\): options class .*Plain.* does not derive from omni_rl\.option\.ComponentOptions"):
        bind_options(Plain, {"scale": 2}, "k", "test")
