"""Finds the extensions (model adapters, rewards) without the core importing them by path.

`load_plugins` imports every module of the `omni_rl.plugins` entry-point group (the project's
`adapters` and `rewards`, and users' packages) and those named in the config
(`plugins: [my_pkg.my_rewards]`); one that fails to import raises naming it, rather than surfacing
later as an "unknown reward".
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Iterable

from omni_rl.errors import OmniConfigError

ENTRY_POINT_GROUP = "omni_rl.plugins"

_loaded: set[str] = set()


class PluginError(OmniConfigError, ImportError):
    """A plugin module named by an entry point or the config could not be imported."""


def load_plugins(extra_modules: Iterable[str] = ()) -> list[str]:
    """Import the entry-point plugins and `extra_modules` once each; return the module names."""
    names = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += list(extra_modules)
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise PluginError(
                f"plugin module {name!r} could not be imported ({err}); check the `plugins` list "
                f"in the config or the {ENTRY_POINT_GROUP!r} entry points of the installed packages"
            ) from err
        _loaded.add(name)
    return names
