"""What `python -m omni_rl.reward.server --scorer SPEC` serves: a registered served scorer's name
(`SERVED_SCORERS`: `latent_stats`, `latent_reward_model` of `rewards/latent_scorers.py`, or a
plugin's `@register_served_scorer(name)`), `module:factory` (called with `--kwargs`) or
`reward:NAME` (a registered reward, `RegisteredReward`). `load_scorer` builds it, refusing options
the factory does not take before it runs. Serving is `app.py`'s, the command line `serve.py`'s."""
from __future__ import annotations

import importlib
import inspect
import json
from typing import Any, Callable, Sequence

import torch

from omni_rl.registry import Registry
from omni_rl.reward.scores import RewardScores
from omni_rl.reward.protocol import IMAGES
from omni_rl.reward.server.app import OneKindScorer, ServedScorer

# Scorers `--scorer NAME` serves by name: factories `(**kwargs) -> ServedScorer`, registered with
# `@register_served_scorer(name)` by rewards/ (the latent demo scorers) or a plugin.
SERVED_SCORERS: Registry = Registry("served scorer")


def register_served_scorer(name: str):
    return SERVED_SCORERS.register(name)


class RegisteredReward(OneKindScorer):
    """Serves a registered omni-rl reward: uint8 images [B, H, W, C] -> its B scores."""

    accepts = IMAGES

    def __init__(self, name: str, scorer: Callable[..., Sequence[float]]):
        self.name = name
        self.scorer = scorer

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> Sequence[float]:
        out = self.scorer(images, prompts, metadata)
        # The protocol carries scores only: a reward's per-sample groups stay on this side.
        return out.scores if isinstance(out, RewardScores) else out

    def __repr__(self) -> str:
        return f"reward:{self.name}"


def load_scorer(spec: str, kwargs: dict[str, Any] | None = None) -> ServedScorer:
    """Build the scorer named by a `--scorer` spec (see the module docstring).

    A spec or option that does not fit raises ValueError (or `RewardConfigError`, a
    ValueError, for a `reward:NAME`) naming it; errors raised inside a factory propagate.
    """
    kwargs = dict(kwargs or {})
    from omni_rl.plugins import load_plugins

    load_plugins()  # the served scorers of rewards/ (latent_stats, ...) and of plugins register there
    if spec in SERVED_SCORERS:
        _check_factory_kwargs(spec, SERVED_SCORERS.get(spec), kwargs)
        return SERVED_SCORERS.get(spec)(**kwargs)
    if spec.startswith("reward:"):
        from omni_rl.registry import RegistryError
        from omni_rl.reward.registry import build_reward

        name = spec[len("reward:"):]
        try:
            return RegisteredReward(name, build_reward(name, **kwargs))
        except RegistryError as err:
            raise ValueError(f"--scorer {spec!r}: {err}") from None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"--scorer {spec!r}: expected a built-in name ({', '.join(SERVED_SCORERS.in_registration_order())}), "
            f"'module:factory' or 'reward:NAME'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--scorer {spec!r}: module {module_name!r} could not be imported ({err})") from err
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--scorer {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise ValueError(f"--scorer {spec!r}: {attr!r} is a {type(factory).__name__}; expected a factory function")
    _check_factory_kwargs(spec, factory, kwargs)
    scorer = factory(**kwargs)
    if not callable(scorer):
        raise ValueError(
            f"--scorer {spec!r}: the factory returned a {type(scorer).__name__}; expected a callable "
            f"(tensor, prompts, metadata) -> list[float]"
        )
    return scorer


def _check_factory_kwargs(spec: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    # Checked before the call, so a TypeError raised inside the factory is not taken for a typo.
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature
        return
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        accepted = [
            p.name for p in signature.parameters.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        raise ValueError(
            f"--scorer {spec!r} --kwargs {json.dumps(kwargs)}: {err}; accepted options: "
            f"{', '.join(accepted) or '(none)'}"
        ) from None
