"""Finds the extensions (model adapters, rewards) without the core importing them by path.

`load_plugins` imports every module of the `omni_rl.plugins` entry-point group (the project's
`adapters` and `rewards`, and users' packages) and those named in the config
(`plugins: [my_pkg.my_rewards]`); one that fails to import raises naming it, rather than surfacing
later as an "unknown reward".
"""
from __future__ import annotations

import importlib
import pkgutil
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


def import_package_modules(package: str, path: Iterable[str], helpers: Iterable[str] = ()) -> list[str]:
    """Import every module of the package `package` (whose `__path__` is `path`) and of its
    subpackages, in name order, except `helpers` (dotted names relative to `package`): what a
    plugin package's `__init__` calls, so that a new module registers itself with no second
    edit. Helpers register nothing and are imported by the modules that use them (some import
    heavy packages at their top). Returns the names imported."""
    skip = {f"{package}.{name}" for name in helpers}
    imported: list[str] = []

    def walk(prefix: str, folders: Iterable[str]) -> None:
        for info in sorted(pkgutil.iter_modules(list(folders), prefix=f"{prefix}."), key=lambda i: i.name):
            if info.name in skip:
                continue
            module = importlib.import_module(info.name)
            imported.append(info.name)
            if info.ispkg:
                walk(info.name, module.__path__)

    walk(package, path)
    return imported
