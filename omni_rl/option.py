"""`option()`: how a component declares one of its options (a dataclass field with a default and
one line of documentation). The one definition, for the config layer (`omni_rl.config.options`
binds and describes such dataclasses) and for the losses in `omni_rl.algos`, which may import
nothing else of the project. This module imports only the standard library.
"""
from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["option"]


def option(default: Any, doc: str, *, infinite: bool = False) -> Any:
    """A dataclass field with a default and one line of documentation (`--options` prints it).
    A list or dict default is copied per instance. `infinite`: a float option that may be set to
    +-inf (NaN is refused always)."""
    metadata = {"doc": doc, "infinite": infinite}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)
