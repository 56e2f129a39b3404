"""Cheap rule rewards on generated text, for CPU demos a tiny random-weight LM learns quickly.

For text samples (one generated response per sample; see `omni_rl.reward.inputs`); prompts
and metadata are ignored. Lengths count Python characters (Unicode code points), not tokens.

    response_length  -|len(response) - target| / target, in (-inf, 0]: 0 at exactly `target`
                     characters, -1 for an empty response (or one 2 x target long). `target`
                     (an int >= 1) is required: there is no natural default length.
    char_match       the fraction of the response's characters that are in `chars` (default
                     "a"; "aeiou" counts every vowel), in [0, 1]; 0.0 for an empty response.
                     Case-sensitive. A larger set makes the reward denser: a random byte-level
                     model writes a given letter ~0.4% of the time, any lowercase letter ~10%.

Both are well defined for every string, the empty one included, and move smoothly with small
changes of the response, which is what lets a tiny policy climb them in a few dozen steps.
They say nothing about quality: a policy maximising `char_match` learns to write "aaaa".
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.inputs import check_batch, to_text_list


class ResponseLengthScorer:
    """Scores each response -|len - target| / target (characters)."""

    def __init__(self, target: int):
        if isinstance(target, bool) or not isinstance(target, numbers.Integral) or target < 1:
            raise ValueError(f"response_length: target={target!r}; expected an int >= 1 (characters)")
        self.target = int(target)

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(samples, prompts, metadata)
        return [-abs(len(text) - self.target) / self.target for text in to_text_list(samples)]

    def __repr__(self) -> str:
        return f"ResponseLengthScorer(target={self.target})"


class CharMatchScorer:
    """Scores each response by the fraction of its characters that are in `chars`."""

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars:
            raise ValueError(f"char_match: chars={chars!r}; expected a non-empty string, e.g. 'a' or 'aeiou'")
        self.chars = frozenset(chars)

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(samples, prompts, metadata)
        return [sum(c in self.chars for c in text) / len(text) if text else 0.0 for text in to_text_list(samples)]

    def __repr__(self) -> str:
        return f"CharMatchScorer(chars={''.join(sorted(self.chars))!r})"


@register_reward("response_length")
def response_length(*, target: int) -> ResponseLengthScorer:
    """-|len(response) - target| / target, on characters."""
    return ResponseLengthScorer(target)


@register_reward("char_match")
def char_match(*, chars: str = "a") -> CharMatchScorer:
    """Fraction of the response's characters that are in `chars`."""
    return CharMatchScorer(chars)
