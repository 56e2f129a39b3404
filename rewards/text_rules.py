"""Cheap rule rewards on generated text, for CPU demos a tiny random-weight LM learns quickly.

    response_length  -|len(response) - target| / target   (0 at `target` characters; target required)
    char_match       the fraction of the response's characters in `chars` (default "a")

Both are defined for every string and move smoothly with small changes, so a tiny policy climbs
them in a few dozen steps; they say nothing about quality. With `text_key` they score
`metadata[text_key]` instead (a talker's `spoken_text`), for samples of any modality.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.inputs import check_batch, to_text_list
from omni_rl.reward.registry import DEFAULT_MODALITIES, MODALITIES
from rewards.transcripts import reference_texts


def scored_texts(reward: str, samples, prompts: Sequence[str], metadata: Sequence[dict[str, Any]],
                 text_key: str | None) -> list[str]:
    """The texts a text rule scores: the samples, or each sample's `metadata[text_key]`."""
    if text_key is None:
        check_batch(samples, prompts, metadata)
        return to_text_list(samples)
    if len(prompts) != len(metadata):
        raise ValueError(f"{reward}: {len(prompts)} prompts but {len(metadata)} metadata dicts; expected one each")
    return reference_texts(reward, metadata, text_key)


class ResponseLengthScorer:
    """Scores each response -|len - target| / target (characters)."""

    def __init__(self, target: int, text_key: str | None = None):
        _check_target(target)
        _check_text_key(text_key)
        self.target = int(target)
        self.text_key = text_key

    def __call__(self, samples, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        texts = scored_texts("response_length", samples, prompts, metadata, self.text_key)
        return [-abs(len(text) - self.target) / self.target for text in texts]

    def __repr__(self) -> str:
        return f"ResponseLengthScorer(target={self.target})"


class CharMatchScorer:
    """Scores each response by the fraction of its characters that are in `chars`."""

    def __init__(self, chars: str, text_key: str | None = None):
        _check_chars(chars)
        _check_text_key(text_key)
        self.chars = frozenset(chars)
        self.text_key = text_key

    def __call__(self, samples, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        texts = scored_texts("char_match", samples, prompts, metadata, self.text_key)
        return [sum(c in self.chars for c in text) / len(text) if text else 0.0 for text in texts]

    def __repr__(self) -> str:
        return f"CharMatchScorer(chars={''.join(sorted(self.chars))!r})"


def _check_text_key(text_key: str | None) -> None:
    if text_key is not None and (not isinstance(text_key, str) or not text_key):
        raise ValueError(f"text_key={text_key!r}; expected the metadata key of the text to score (e.g. spoken_text) "
                         f"or null to score the samples")


def _check_options(*, text_key: str | None = None, **options: Any) -> None:
    """At config load, before any model loads: what the scorers' constructors check too."""
    _check_text_key(text_key)
    # The registry's message names the reward already: no prefix here.
    if "chars" in options:
        _check_chars(options["chars"], "")
    if "target" in options:
        _check_target(options["target"], "")


def _check_chars(chars: Any, prefix: str = "char_match: ") -> None:
    if not isinstance(chars, str) or not chars:
        raise ValueError(f"{prefix}chars={chars!r}; expected a non-empty string, e.g. 'a' or 'aeiou'")


def _check_target(target: Any, prefix: str = "response_length: ") -> None:
    if isinstance(target, bool) or not isinstance(target, numbers.Integral) or target < 1:
        raise ValueError(f"{prefix}target={target!r}; expected an int >= 1 (characters)")


def _modalities(*, text_key: str | None = None, **_: Any) -> frozenset[str]:
    # With a key the sample itself is not read: speech, images or video carrying a text all score.
    return MODALITIES if text_key is not None else DEFAULT_MODALITIES


def _needs_metadata(*, text_key: str | None = None, **_: Any) -> set[str]:
    return set() if text_key is None else {text_key}


@register_reward("response_length", modalities=_modalities, check_options=_check_options, needs_metadata=_needs_metadata)
def response_length(*, target: int, text_key: str | None = None) -> ResponseLengthScorer:
    """-|len(response) - target| / target, on characters."""
    return ResponseLengthScorer(target, text_key)


@register_reward("char_match", modalities=_modalities, check_options=_check_options, needs_metadata=_needs_metadata)
def char_match(*, chars: str = "a", text_key: str | None = None) -> CharMatchScorer:
    """Fraction of the response's (or metadata[text_key]'s) characters that are in `chars`."""
    return CharMatchScorer(chars, text_key)
