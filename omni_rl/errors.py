"""The two error bases every failure the command line reports derives from.

`OmniConfigError` (a `ValueError`): bad input found before or while a run starts (a config value,
a file, a model folder, a checkpoint, a device): one `error:` line, exit 2. `OmniRunError` (a
`RuntimeError`): a run that started and failed (a reward, the engine, a worker, a full disk): one
`error:` line, exit 1. Each module keeps its own subclass, whose message names the bad value,
what was expected and what to do; `exit_code` says what the command line returns. `ConfigError`, the config's and every
component option's error, lives here too. This module
imports nothing, so any layer may use it.
"""
from __future__ import annotations

__all__ = ["ConfigError", "OmniConfigError", "OmniRunError"]


class OmniConfigError(ValueError):
    """Bad input: the message names the key or file, the bad value and what was expected."""

    exit_code = 2


class ConfigError(OmniConfigError):
    """A bad config value or component option; the message names the key and what was expected."""


class OmniRunError(RuntimeError):
    """A run that failed after it started: the message names the component that failed."""

    exit_code = 1
