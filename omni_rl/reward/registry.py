"""The reward registry: names -> scorer factories.

A reward is registered as a *factory*: a class or function that takes keyword arguments only
(the reward's options from the config, e.g. `scale=0.002`) and returns a *scorer*:

    scorer(images, prompts, metadata) -> list[float]      # one score per image

`images`, `prompts` and `metadata` follow the contract in `omni_rl.reward.inputs` (a list of
PIL images or a uint8 tensor [B, H, W, C]; one prompt string and one metadata dict per image).
The canonical return type is a list of B Python floats; the `RewardManager` also accepts a
1-D float numpy array or tensor of length B and converts it. Higher is better.

Expensive set-up (loading a model) belongs in the factory, so it runs once; the scorer is
called every training step. A factory whose module imports heavy packages should import them
inside the factory, so that `load_plugins()` stays cheap for users who do not use it.

    @register_reward("my_reward")
    def my_reward(*, threshold: float = 0.5) -> Scorer:
        def score(images, prompts, metadata):
            ...
        return score

    scorer = build_reward("my_reward", threshold=0.3)

A factory may carry a `check_options(**options)` attribute that checks option *values*
without building anything (a URL's scheme, a range) and raises ValueError naming the option.
`check_reward_options`, which the config runs at load time, calls it after the signature
check, so such a mistake stops the run before any model is loaded:

    my_reward.check_options = lambda *, threshold=0.5: ...   # raise ValueError if bad
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from omni_rl.plugins import load_plugins
from omni_rl.registry import Registry
from omni_rl.reward.inputs import Images

Scorer = Callable[[Images, Sequence[str], Sequence[dict[str, Any]]], Sequence[float]]
RewardFactory = Callable[..., Scorer]

REWARDS: Registry[RewardFactory] = Registry("reward")


class RewardConfigError(TypeError, ValueError):
    """A reward is configured wrongly: unknown option, bad weight, duplicate name, ...

    It subclasses both TypeError (a bad keyword argument to a factory) and ValueError (a bad
    value in the reward list), so callers can catch it as either.
    """


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: register a scorer factory under `name` (a duplicate name raises)."""
    return REWARDS.register(name)


def build_reward(name: str, /, **kwargs: Any) -> Scorer:
    """Load the plugins, then return `factory(**kwargs)` for the reward registered as `name`.

    An unknown name raises `RegistryError` listing the registered rewards; an option the
    factory does not take raises `RewardConfigError` naming the reward, the option and the
    accepted ones. Errors raised by the factory itself propagate with a note naming the reward.
    """
    load_plugins()
    factory = REWARDS.get(name)
    _check_kwargs(name, factory, kwargs)
    _check_values(name, factory, kwargs)
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
    """Check `kwargs` against the registered factory's signature, then with its
    `check_options` when it has one, without building the reward; raise RewardConfigError."""
    factory = REWARDS.get(name)
    _check_kwargs(name, factory, kwargs)
    _check_values(name, factory, kwargs)


def _check_values(name: str, factory: RewardFactory, kwargs: dict[str, Any]) -> None:
    check = getattr(factory, "check_options", None)
    if check is None:
        return
    try:
        check(**kwargs)
    except (TypeError, ValueError) as err:
        raise RewardConfigError(f"reward {name!r}: {err}") from None


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
