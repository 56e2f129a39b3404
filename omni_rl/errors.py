"""The two error bases every failure the command line reports derives from.

- `OmniConfigError` (a `ValueError`): bad input found before or while a run starts: a config
  value, a recipe, a prompt or preference file, a model folder, a checkpoint to resume, a
  device. The command line prints it as one `error:` line and exits 2.
- `OmniRunError` (a `RuntimeError`): a run that started and failed: a reward, the rollout
  engine, a worker, a non-finite loss, a full disk. One `error:` line, exit 1.

Each module keeps its own subclass (so a caller can catch just a rollout failure), and the
message of each names the bad value, what was expected and what to do. Each carries the exit
code the command line returns for it (`exit_code`: 2 and 1; a subclass may set its own, as a
run stopped by signal N does with 128 + N), so the command line catches these two bases and
nothing else. `ConfigError`, the config's and every component option's error, lives here too,
so that the config layer and the maths below it share it. This module imports nothing, so any
layer may use it.
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
