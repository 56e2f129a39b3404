"""`option()`: how a component declares one of its options (a dataclass field with a default and
one line of documentation), and `ComponentOptions`, the base every options dataclass derives from.
The one definition, for the config layer (`omni_rl.config.options` binds and describes such
dataclasses) and for the losses in `omni_rl.algos`, which may import nothing else of the project. This module imports only the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ComponentOptions", "option"]


@dataclass
class ComponentOptions:
    """The base of a component's options dataclass: `check()` holds its value rules, run when its
    block is bound at load (raise `ValueError(message)` naming the option); none by default."""

    def check(self) -> None:
        """Refuse a value the component cannot take (none refused by default)."""


def option(default: Any, doc: str, *, infinite: bool = False) -> Any:
    """A dataclass field with a default and one line of documentation (`--options` prints it).
    A list or dict default is copied per instance. `infinite`: a float option that may be set to
    +-inf (NaN is refused always)."""
    metadata = {"doc": doc, "infinite": infinite}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)
