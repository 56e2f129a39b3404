"""`format`: 1.0 when a response has the expected structure, else 0.0 (correctness not checked).

`pattern`: `boxed` (exactly one closed, non-blank `\\boxed{}`), `think_answer` (`<think>...</think>`
then `<answer>...</answer>` and nothing else, one of each, non-blank: the R1 / verl template) or
`think_boxed` (a leading think block, then one closed `\\boxed{}`: MMK12's format half). Tags
are matched in lower case; an empty response scores 0.

Left out on purpose: a `<think>` pre-filled by the chat template; partial scores.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.inputs import check_batch, to_text_list
from rewards.answer_extraction import boxed_contents

PATTERNS = ("boxed", "think_answer", "think_boxed")

def has_one_box(text: str) -> bool:
    """Exactly one `\\boxed`/`\\fbox` in `text`, closed, with non-blank content."""
    boxes = boxed_contents(text)
    return len(boxes) == 1 and boxes[0] is not None and bool(boxes[0].strip())


def _split_think(text: str) -> Optional[tuple[str, str]]:
    """(think content, the rest) when `text` starts with its only <think>...</think> pair."""
    body = text.lstrip()
    if not body.startswith("<think>") or text.count("<think>") != 1 or text.count("</think>") != 1:
        return None
    think, closed, rest = body[len("<think>") :].partition("</think>")
    return (think, rest) if closed else None


def is_think_answer(text: str) -> bool:
    """`<think>` non-blank `</think>` `<answer>` non-blank `</answer>`, only whitespace around."""
    split = _split_think(text)
    if split is None or text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return False
    think, rest = split
    rest = rest.strip()
    if not (rest.startswith("<answer>") and rest.endswith("</answer>")):
        return False
    answer = rest[len("<answer>") : -len("</answer>")]
    return bool(think.strip()) and bool(answer.strip())


def is_think_boxed(text: str) -> bool:
    """`<think>` non-blank `</think>` first, then text with one closed, non-blank `\\boxed{}`."""
    split = _split_think(text)
    return split is not None and bool(split[0].strip()) and has_one_box(split[1])


_CHECKS: dict[str, Callable[[str], bool]] = {
    "boxed": has_one_box,
    "think_answer": is_think_answer,
    "think_boxed": is_think_boxed,
}


class FormatScorer:
    """Scores each response 1.0 when it has the structure named by `pattern`, else 0.0."""

    def __init__(self, pattern: str):
        if pattern not in _CHECKS:
            raise ValueError(
                f"format: pattern={pattern!r}; expected one of {list(PATTERNS)} (see rewards/format.py)"
            )
        self.pattern = pattern
        self._check = _CHECKS[pattern]

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(samples, prompts, metadata)
        return [1.0 if self._check(text) else 0.0 for text in to_text_list(samples)]

    def __repr__(self) -> str:
        return f"FormatScorer(pattern={self.pattern!r})"


@register_reward("format")
def format_reward(*, pattern: str = "boxed") -> FormatScorer:
    """1.0 when the response has the structure `pattern` (boxed, think_answer, think_boxed)."""
    return FormatScorer(pattern)
