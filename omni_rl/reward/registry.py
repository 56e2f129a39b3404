"""The reward registry: names -> scorer factories.

A reward is a factory taking keyword-only options and returning a scorer
`scorer(images, prompts, metadata) -> list[float]` (one score per sample, higher is better).
Expensive set-up and heavy imports belong in the factory. What a reward declares about itself
(modalities, option and prompt checks, metadata it needs, networks for `--plan`) is its entry's
`RewardDeclaration`; docs/extending/reward.md shows each.

    @register_reward("my_reward", modalities={"image"})
    def my_reward(*, threshold: float = 0.5) -> Scorer:
        def score(images, prompts, metadata):
            ...
        return score
"""
from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

from omni_rl.errors import OmniConfigError
from omni_rl.plugins import load_plugins
from omni_rl.registry import Registry
from omni_rl.reward.inputs import Images

Scorer = Callable[[Images, Sequence[str], Sequence[dict[str, Any]]], Sequence[float]]
RewardFactory = Callable[..., Scorer]

REWARDS: Registry[RewardFactory] = Registry("reward")

MODALITIES = frozenset({"image", "text", "video", "audio"})
# What a reward that declares nothing scores (every reward before video and audio).
DEFAULT_MODALITIES = frozenset({"image", "text"})
Modalities = Union[Iterable[str], Callable[..., Iterable[str]]]


# What a reward can check of the prompts it will score, at load: (prompts, metadata) -> None.
PromptCheck = Callable[[Sequence[str], Sequence[dict]], None]
# What it needs of one prompt and its metadata: (prompt, metadata) -> None, or the reason it cannot score it.
ItemCheck = Callable[[str, dict], Union[str, None]]


def reward_prompt_check(name: str) -> PromptCheck | None:
    """The registered reward `name`'s load-time check of its prompts, if it declared one."""
    return reward_declaration(name).check_prompts


class RewardConfigError(OmniConfigError, TypeError):
    """A reward is configured wrongly (unknown option, bad weight, duplicate name); both a TypeError
    and a ValueError, so callers can catch it as either.
    """


@dataclass(frozen=True)
class RewardDeclaration:
    """What a reward declares about itself: the spec its registry entry carries (None: not declared).

    modalities:    what it scores, a subset of `MODALITIES` or `(**options) -> subset`; default
                   {"image", "text"}.
    check_options: `(**options) -> None`, raising ValueError naming a bad option value (config load).
    check_prompts: `(prompts, metadata) -> None`, raising `RewardInputError` naming a prompt it
                   cannot score (when the prompts load, before any model).
    needs_metadata: the metadata keys each sample must carry, a set or `(**options) -> set`.
    check_item:    `(prompt, metadata) -> None | reason`, run on every prompt before any model loads.
    check_files:   `(**options) -> None`, raising ValueError for an option's missing file; run when a
                   training run starts, so a recipe naming the user's files still loads and plans.
    device_networks: `(**options) -> [(label, module)]`, the networks it holds, built on the meta
                   device from configs, for `--plan` to count.
    endpoint:      `(**options) -> str`, where a remote scorer sends its samples (its URL), named by
                   `RewardManager.describe`; None: it scores in this process.
    """

    modalities: Modalities | None = None
    check_options: Callable[..., None] | None = None
    check_prompts: PromptCheck | None = None
    needs_metadata: Iterable[str] | Callable[..., Iterable[str]] | None = None
    check_files: Callable[..., None] | None = None
    device_networks: Callable[..., list[tuple[str, Any]]] | None = None
    check_item: ItemCheck | None = None
    endpoint: Callable[..., str] | None = None


NO_DECLARATION = RewardDeclaration()


def register_reward(
    name: str, modalities: Modalities | None = None, *, check_options: Callable[..., None] | None = None,
    check_prompts: PromptCheck | None = None, needs_metadata: Iterable[str] | Callable[..., Iterable[str]] | None = None,
    check_files: Callable[..., None] | None = None, device_networks: Callable[..., list[tuple[str, Any]]] | None = None,
    check_item: ItemCheck | None = None, endpoint: Callable[..., str] | None = None,
) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: register a scorer factory under `name` (a duplicate name raises), with its
    `RewardDeclaration` (see there for `modalities`, `check_options`, `check_prompts` and
    `needs_metadata`, `check_files`, `device_networks`, `check_item`, `endpoint`)."""
    if modalities is not None and not callable(modalities):
        modalities = _check_modalities(name, modalities)
    if check_options is not None and not callable(check_options):
        raise RewardConfigError(f"reward {name!r}: check_options={check_options!r}; expected a callable (**options) -> None")
    if needs_metadata is not None and not callable(needs_metadata):
        needs_metadata = _check_keys(name, needs_metadata)
    if check_files is not None and not callable(check_files):
        raise RewardConfigError(f"reward {name!r}: check_files={check_files!r}; expected a callable (**options) -> None")
    if device_networks is not None and not callable(device_networks):
        raise RewardConfigError(
            f"reward {name!r}: device_networks={device_networks!r}; expected a callable (**options) -> [(label, module)]"
        )
    if check_item is not None and not callable(check_item):
        raise RewardConfigError(f"reward {name!r}: check_item={check_item!r}; expected a callable (prompt, metadata) -> None | str")
    if endpoint is not None and not callable(endpoint):
        raise RewardConfigError(f"reward {name!r}: endpoint={endpoint!r}; expected a callable (**options) -> str")
    declaration = RewardDeclaration(modalities, check_options, check_prompts, needs_metadata, check_files, device_networks,
                                    check_item, endpoint)
    return REWARDS.register(name, spec=None if declaration == NO_DECLARATION else declaration)


def reward_declaration(name: str) -> RewardDeclaration:
    """The declaration the reward registered as `name` carries (an unknown name raises)."""
    return REWARDS.spec(name) or NO_DECLARATION


def reward_modalities(name: str, options: dict[str, Any] | None = None) -> frozenset[str]:
    """What the reward registered as `name`, built with `options`, scores: a frozenset of
    `MODALITIES`. A callable declaration that rejects the options raises RewardConfigError."""
    declared = reward_declaration(name).modalities
    if declared is None:
        return DEFAULT_MODALITIES
    if callable(declared):
        try:
            declared = declared(**dict(options or {}))
        except (TypeError, ValueError) as err:
            raise RewardConfigError(f"reward {name!r}: {err}") from None
    return _check_modalities(name, declared)


def reward_metadata_needs(name: str, options: dict[str, Any] | None = None) -> frozenset[str]:
    """The metadata keys every sample must carry for the reward registered as `name`, built with
    `options`, to score it (empty when it declared none). A callable declaration that rejects the
    options raises RewardConfigError."""
    declared = reward_declaration(name).needs_metadata
    if declared is None:
        return frozenset()
    if callable(declared):
        try:
            declared = declared(**dict(options or {}))
        except (TypeError, ValueError) as err:
            raise RewardConfigError(f"reward {name!r}: {err}") from None
    return _check_keys(name, declared)


def reward_endpoint(name: str, options: dict[str, Any] | None = None) -> str | None:
    """Where the reward registered as `name`, built with `options`, sends its samples (its
    declared `endpoint`); None for a reward that scores in this process."""
    declared = reward_declaration(name).endpoint
    return None if declared is None else declared(**dict(options or {}))


def _check_keys(name: str, keys: Any) -> frozenset[str]:
    if isinstance(keys, str) or not isinstance(keys, Iterable) or not all(isinstance(k, str) and k for k in keys):
        raise RewardConfigError(
            f"reward {name!r}: needs_metadata={keys!r}; expected a set of metadata keys (non-empty str), e.g. {{'spoken_text'}}"
        )
    return frozenset(keys)


def _check_modalities(name: str, modalities: Any) -> frozenset[str]:
    if isinstance(modalities, str):
        raise RewardConfigError(
            f"reward {name!r}: modalities={modalities!r} is a string; expected a set, e.g. {{{modalities!r}}}"
        )
    try:
        found = frozenset(modalities)
    except TypeError:
        raise RewardConfigError(
            f"reward {name!r}: modalities has type {type(modalities).__name__}; expected a set of "
            f"{sorted(MODALITIES)}"
        ) from None
    unknown = sorted(found - MODALITIES, key=str)
    if unknown or not found:
        raise RewardConfigError(
            f"reward {name!r}: modalities={sorted(found, key=str)}; expected a non-empty subset of {sorted(MODALITIES)}"
        )
    return found


def build_reward(name: str, /, **kwargs: Any) -> Scorer:
    """Load the plugins, then return `factory(**kwargs)` for the reward registered as `name`.

    An unknown name raises `RegistryError` listing the rewards; an option the factory does not take
    raises `RewardConfigError` naming it and the accepted ones.
    """
    load_plugins()
    factory = REWARDS.get(name)
    _check_kwargs(name, factory, kwargs)
    _check_values(name, kwargs)
    check_reward_files(name, kwargs)
    try:
        scorer = factory(**kwargs)
    except Exception as err:
        if hasattr(err, "add_note"):  # Python >= 3.11
            err.add_note(f"(while building reward {name!r} with options {kwargs!r})")
        raise
    if not callable(scorer):
        raise RewardConfigError(
            f"reward {name!r}: its factory returned a {type(scorer).__name__}, which is not callable; "
            f"a factory must return a scorer (images, prompts, metadata) -> list[float]"
        )
    return scorer


def check_reward_options(name: str, kwargs: dict[str, Any]) -> None:
    """Check `kwargs` against the registered factory's signature, then with its declared
    `check_options` when it has one, without building the reward; raise RewardConfigError."""
    factory = REWARDS.get(name)
    _check_kwargs(name, factory, kwargs)
    _check_values(name, kwargs)


def check_reward_files(name: str, kwargs: dict[str, Any]) -> None:
    """The files the reward's options name read (its declared `check_files`); raise
    RewardConfigError naming the reward. Run when a run starts and when the reward is built."""
    check = reward_declaration(name).check_files
    if check is None:
        return
    try:
        check(**kwargs)
    except (TypeError, ValueError) as err:
        raise RewardConfigError(f"reward {name!r}: {err}") from None


def _check_values(name: str, kwargs: dict[str, Any]) -> None:
    # No option a reward declares a float (a scale, a threshold, a timeout) is one for which NaN
    # or infinity means something: refused for every reward here, before its own check.
    floats = _float_parameters(REWARDS.get(name))
    for key, value in kwargs.items():
        if key in floats and isinstance(value, float) and not math.isfinite(value):
            # In the rewards' own style ("pickscore: scale=..."), as their factories word it.
            raise RewardConfigError(f"{name}: {key}={value!r}; expected a finite number: set a finite value")
    check = reward_declaration(name).check_options
    if check is None:
        return
    try:
        check(**kwargs)
    except (TypeError, ValueError) as err:
        raise RewardConfigError(f"reward {name!r}: {err}") from None


def _float_parameters(factory: RewardFactory) -> frozenset[str]:
    """The factory's parameters annotated `float` or `float | None` (a string annotation under
    `from __future__ import annotations`, read as written)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    written = {float, "float", "float | None", "None | float", "Optional[float]", typing.Optional[float]}
    return frozenset(p.name for p in params if p.annotation in written)


def _check_kwargs(name: str, factory: RewardFactory, kwargs: dict[str, Any]) -> None:
    # Checked against the signature before the call, so a TypeError raised *inside* a factory
    # (a genuine bug there) is not mistaken for a typo in the config.
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins/extension types have no signature
        return
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [
        p.name for p in params
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    accepted_text = ", ".join(accepted) or "(none)"
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise RewardConfigError(
            f"reward {name!r} got unknown option(s) {', '.join(map(repr, unknown))}; "
            f"accepted options: {accepted_text}. Check the spelling in the reward config"
        )
    try:
        signature.bind(**kwargs)
    except TypeError as err:  # e.g. a required option is missing
        raise RewardConfigError(
            f"reward {name!r}: {err}; accepted options: {accepted_text}"
        ) from None
