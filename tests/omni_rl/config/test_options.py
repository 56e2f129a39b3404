"""bind_options / options_help: a component's options block bound to its dataclass, one-line errors."""
from dataclasses import dataclass
from typing import Optional

import pytest

from omni_rl.config.options import bind_options, describe_options, options_help
from omni_rl.option import ComponentOptions, option
from omni_rl.errors import ConfigError
from omni_rl.errors import OmniConfigError


@dataclass
class _Options(ComponentOptions):
    scale: float = option(0.0, "A scale (0 = off).")
    blocks: list[int] = option([], "Block indices.")
    size: Optional[list[int]] = option(None, "[height, width], or null.")

    def check(self) -> None:
        if self.scale < 0:
            raise ValueError(f"scale={self.scale!r}: expected >= 0 (0 = off)")


def test_binds_values_and_defaults():
    bound = bind_options(_Options, {"scale": 2, "size": [4, 8]}, "model.adapter_options", "adapter X")
    assert bound == _Options(scale=2.0, blocks=[], size=[4, 8])
    assert isinstance(bound.scale, float)
    assert bind_options(_Options, None, "model.adapter_options", "adapter X") == _Options()
    # list defaults are not shared between instances
    assert _Options().blocks is not _Options().blocks


@pytest.mark.parametrize("values, message", [
    ({"nope": 1}, "model.adapter_options.nope=1: adapter X has no option 'nope'; its options: blocks, scale, size"),
    ({"scale": "a"}, "model.adapter_options.scale='a': expected float (adapter X)"),
    ({"scale": True}, "model.adapter_options.scale=True: expected float (adapter X)"),
    ({"blocks": [1.5]}, "model.adapter_options.blocks=[1.5]: expected list[int] (adapter X)"),
    ({"scale": -1}, "model.adapter_options.scale=-1.0: expected >= 0 (0 = off)"),
])
def test_bad_values_are_one_line_naming_the_key(values, message):
    with pytest.raises(ConfigError) as err:
        bind_options(_Options, values, "model.adapter_options", "adapter X")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, OmniConfigError)


def test_help_lists_every_option_with_default_and_doc():
    text = options_help(_Options, "model.adapter_options", "adapter X")
    assert text.splitlines()[0] == "adapter X: options under model.adapter_options"
    assert "  scale   float = 0.0  A scale (0 = off)." in text
    assert [d.name for d in describe_options(_Options)] == ["scale", "blocks", "size"]
