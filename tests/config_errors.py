"""`load_error`: the one-line message of the config error that loading some overrides raises (a
config error reaches the CLI as one `error:` line, so a test checks that it is one line)."""
import pytest

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError


def load_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(overrides))
    message = str(info.value)
    assert "\n" not in message, f"a ConfigError must be one line, got: {message!r}"
    return message
