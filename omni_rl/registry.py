"""One small name -> object registry, used by every extension point.

Each registry holds one kind of thing with one call signature. Registering a name twice raises;
an unknown name raises listing the registered ones, so a recipe's typo comes with its fix. An
entry may carry a *spec*, a frozen dataclass of what the thing declares about itself, read with
`spec(name)`: declared at registration, never looked up by attribute name.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

from omni_rl.errors import OmniConfigError

T = TypeVar("T")


class RegistryError(OmniConfigError, KeyError):
    """An unknown or duplicate registry name. `str()` gives the plain message."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the sentence as written
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names to objects of one kind. `kind` names the kind in error messages."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._specs: dict[str, Any] = {}

    def register(self, name: str, obj: T | None = None, *, spec: Any = None) -> Callable[[T], T] | T:
        """Register `obj` under `name` (with its `spec`, if any); without `obj`, return a
        decorator that does it."""
        if obj is not None:
            self._add(name, obj, spec)
            return obj

        def decorator(target: T) -> T:
            self._add(name, target, spec)
            return target

        return decorator

    def spec(self, name: str) -> Any:
        """The spec `name` was registered with (None when it declared none)."""
        self.get(name)  # an unknown name raises, listing the registered ones
        return self._specs.get(name)

    def _add(self, name: str, obj: T, spec: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries and self._entries[name] is not obj:
            raise RegistryError(
                f"{self.kind} {name!r} is already registered (by {_describe(self._entries[name])}); "
                f"choose another name"
            )
        self._entries[name] = obj
        if spec is not None:
            self._specs[name] = spec

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self._entries)) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def in_registration_order(self) -> list[str]:
        """The names in the order they were registered (a module's own order of declaration)."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


class RegistryUnion(Generic[T]):
    """A read-only view of several registries as one kind (`get`, `names`, `in`): where one
    setting picks from entries that live in registries of their own (a diffusion family's
    `algo.policy_loss`: a step loss or a forward-process loss). A name in two of them raises."""

    def __init__(self, kind: str, *registries: Registry):
        self.kind = kind
        self.registries = registries

    def _owners(self, name: object) -> list[Registry]:
        owners = [r for r in self.registries if name in r]
        if len(owners) > 1:
            raise RegistryError(f"{self.kind} {name!r} is registered as {' and as '.join(r.kind for r in owners)}")
        return owners

    def get(self, name: str):
        owners = self._owners(name)
        if not owners:
            raise RegistryError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or '(none)'}")
        return owners[0].get(name)

    def names(self) -> list[str]:
        return sorted(n for r in self.registries for n in r.names())

    def __contains__(self, name: object) -> bool:
        return bool(self._owners(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    qualname = getattr(obj, "__qualname__", type(obj).__qualname__)
    return f"{module}.{qualname}"
