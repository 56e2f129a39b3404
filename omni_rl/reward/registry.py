"""The reward registry: names -> scorer factories.

A reward is registered as a *factory*: a class or function that takes keyword arguments only
(the reward's options from the config, e.g. `scale=0.002`) and returns a *scorer*:

    scorer(images, prompts, metadata) -> list[float]      # one score per image

`images`, `prompts` and `metadata` follow the contract in `omni_rl.reward.inputs` (a list of
PIL images or a uint8 tensor [B, H, W, C]; one prompt string and one metadata dict per image).
The canonical return type is a list of B Python floats; the `RewardManager` also accepts a
1-D float numpy array or tensor of length B and converts it, and a `RewardScores(scores,
groups)` (`omni_rl.reward.scores`), whose per-sample groups it reports as `reward/<group>`
means (GenEval's per-task scores). Higher is better.

Expensive set-up (loading a model) belongs in the factory, so it runs once; the scorer is
called every training step. A factory whose module imports heavy packages should import them
inside the factory, so that `load_plugins()` stays cheap for users who do not use it.

    @register_reward("my_reward")
    def my_reward(*, threshold: float = 0.5) -> Scorer:
        def score(images, prompts, metadata):
            ...
        return score

    scorer = build_reward("my_reward", threshold=0.3)

What a reward declares about itself is its registry entry's spec (`RewardDeclaration`, read
with `reward_declaration(name)`), given to `register_reward`:

- `check_options(**options)` checks option *values* without building anything (a URL's
  scheme, a range) and raises ValueError naming the option (an option annotated float that
  is NaN or infinite is refused for every reward before it runs). `check_reward_options`, which the
  config runs at load time, calls it after the signature check, so such a mistake stops the
  run before any model is loaded:

      @register_reward("my_reward", check_options=check_my_options)  # raises ValueError if bad

- `modalities`: what the reward scores, a subset of `MODALITIES` = {"image", "text", "video",
  "audio"}. When that depends on its options, a callable `(**options) -> set` instead:

      @register_reward("clap", modalities={"audio"})
      @register_reward("imagebind", modalities=lambda *, mode="text_video", **_: MODES[mode])

- `check_item(prompt, metadata) -> None | reason`: what the reward needs of one prompt and its
  metadata (a quoted OCR target, a reference answer, a parseable caption): None when it can
  score the prompt, else the reason in a few words. The pre-load check
  (`omni_rl.reward.prompt_checks.check_reward_prompts`, also under `--plan`) runs it on every prompt and fails
  with one line naming the file, the line or row, the reward and the reason:

      @register_reward("ocr", check_item=check_ocr_item)   # "has no target text: ..."

- `check_prompts(prompts, metadata)`: the same over the whole list at once, raising a
  `RewardInputError` naming the prompt; run on the run's prompts when they load
  (`reward_prompt_check`). Prefer `check_item`, whose failures name the line.

- `needs_metadata`: the metadata keys every sample must carry for the reward to score it (the
  text a speech sample was asked to say), a set or a callable `(**options) -> set` when an option
  names the key; read with `reward_metadata_needs(name, options)`. At load each key must be one
  the model adds to its samples (`OmniModelBase.sample_metadata_keys`) or in every prompt row's
  metadata (`omni_rl.reward.prompt_checks.check_reward_prompts`):

      @register_reward("asr_wer", modalities={"audio"}, needs_metadata=lambda *, text_key="spoken_text", **_: {text_key})

`reward_modalities(name, options)` answers for a configured reward. A reward that declares
nothing scores what every reward scored before video and audio: images or texts (the default
{"image", "text"}). The `RewardManager` hands a `MediaSamples` (`omni_rl.reward.media`) to a
reward that scores video or audio, and the frames of its videos to an image reward given the
option `video_frames` (see `omni_rl.reward.manager`).
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
    """A reward is configured wrongly: unknown option, bad weight, duplicate name, ...

    It subclasses both TypeError (a bad keyword argument to a factory) and ValueError (a bad
    value in the reward list), so callers can catch it as either.
    """


@dataclass(frozen=True)
class RewardDeclaration:
    """What a reward declares about itself: the spec its registry entry carries.

    modalities:    what it scores: a subset of `MODALITIES`, or a callable `(**options) -> subset`
                   when that depends on its options; None = the default {"image", "text"}.
    check_options: `(**options) -> None`, raising ValueError naming a bad option value, run at
                   config load (after the factory's signature check); None = the signature only.
    check_prompts: `(prompts, metadata) -> None`, raising `RewardInputError` naming the prompt
                   for one the reward cannot score (an edit instruction with no direction): called
                   on the run's prompts when they load (`reward_prompt_check`), so a bad row stops
                   the run before any model loads, not at step 1.
    needs_metadata: the metadata keys each sample must carry, a set of str or a callable
                   `(**options) -> set` when an option names them; None = none.
    check_item:    `(prompt, metadata) -> None | reason`: None when the reward can score the prompt,
                   else why not (a few words: "has no target text: ..."); run on every prompt
                   before any model loads, the failure naming the file and the line or row.
    check_files:   `(**options) -> None`, raising ValueError naming an option whose file is
                   missing or unreadable (a reference voice): run when a training run starts,
                   with the prompt files and before any model loads, not at config load, so a
                   recipe that names files the user supplies still loads, plans and prints
                   (as its prompt files need not exist until it runs).
    device_networks: `(**options) -> [(label, module)]`: the networks the reward holds where it
                   scores, each built on the meta device from configuration files only (no
                   weights, no network), in the dtype its loading would give them, for `--plan`
                   to count (`omni_rl.plan.rewards`); None = it holds none on a device (a rule,
                   or an engine that runs on the CPU only, as OCR's).
    """

    modalities: Modalities | None = None
    check_options: Callable[..., None] | None = None
    check_prompts: PromptCheck | None = None
    needs_metadata: Iterable[str] | Callable[..., Iterable[str]] | None = None
    check_files: Callable[..., None] | None = None
    device_networks: Callable[..., list[tuple[str, Any]]] | None = None
    check_item: ItemCheck | None = None


NO_DECLARATION = RewardDeclaration()


def register_reward(
    name: str, modalities: Modalities | None = None, *, check_options: Callable[..., None] | None = None,
    check_prompts: PromptCheck | None = None, needs_metadata: Iterable[str] | Callable[..., Iterable[str]] | None = None,
    check_files: Callable[..., None] | None = None, device_networks: Callable[..., list[tuple[str, Any]]] | None = None,
    check_item: ItemCheck | None = None,
) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: register a scorer factory under `name` (a duplicate name raises), with its
    `RewardDeclaration` (see there for `modalities`, `check_options`, `check_prompts` and
    `needs_metadata`, `check_files`, `device_networks`, `check_item`)."""
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
    declaration = RewardDeclaration(modalities, check_options, check_prompts, needs_metadata, check_files, device_networks,
                                    check_item)
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

    An unknown name raises `RegistryError` listing the registered rewards; an option the
    factory does not take raises `RewardConfigError` naming the reward, the option and the
    accepted ones. Errors raised by the factory itself propagate with a note naming the reward.
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
