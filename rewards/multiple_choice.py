"""`multiple_choice`: 1.0 when the response picks the reference option letter, else 0.0.

For text samples; the reference is `metadata[i]["ground_truth"]` ("B", "(B)"), one of `choices`
(default "ABCDE"). The first rule that finds its pattern decides (explicit containers beat free
text): the last `\\boxed{}`, then the last `<answer>` tag (each must hold one letter, optionally
with the option's text), then the last answer phrase ("the answer is B", `**Answer:** (C)`; an
unparenthesised letter must be upper-case and alone, so "the answer is a prime" picks nothing),
then a response that is one letter. Case-insensitive; no match scores 0.

Left out on purpose: matching the option's text, several correct letters, partial credit.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.inputs import RewardInputError, check_batch, ground_truths, to_text_list
from rewards.answer_extraction import extract_answer_tag, extract_boxed, has_boxed, read_braced

_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*(?=\{)")


class MultipleChoiceScorer:
    """Scores each response 1.0 when its chosen letter equals `metadata[i]["ground_truth"]`."""

    def __init__(self, choices: str):
        if (
            not isinstance(choices, str)
            or not choices
            or not all("A" <= c <= "Z" for c in choices.upper())
            or len(set(choices.upper())) != len(choices)
        ):
            raise ValueError(
                f"multiple_choice: choices={choices!r}; expected a non-empty string of distinct "
                f"letters A-Z, e.g. 'ABCDE' (case does not matter)"
            )
        self.choices = choices.upper()
        upper = re.escape(self.choices)
        both = upper + re.escape(self.choices.lower())
        self._content_re = re.compile(rf"\(?([{both}])\)?(?:[.:)\s]|$)")
        self._phrase_re = re.compile(
            rf"(?i:answer)[\s*:]*(?:(?i:is)[\s*:]+)?(?:(?i:option|choice)\s*)?"
            rf"(?:\(([{both}])\)|([{upper}])(?![A-Za-z0-9]))"
        )
        self._alone_re = re.compile(rf"[\s*]*\(?([{both}])\)?\.?[\s*]*")
        self._reference_re = re.compile(rf"\s*\(?([{both}])\)?\.?\s*")

    def letter_of(self, content: str) -> Optional[str]:
        """The option letter at the start of a box/tag content (`B`, `(B)`, `B. text`), or None."""
        text = content.replace("$", "").strip()
        for _ in range(3):  # unwrap \text{B}, \textbf{\text{B}}; deeper nesting is not a letter
            match = _TEXT_WRAP_RE.match(text)
            braced = read_braced(text, match.end()) if match else None
            if braced is None:
                break
            text = (braced[0] + text[braced[1]:]).strip()
        match = self._content_re.match(text)
        return match.group(1).upper() if match else None

    def chosen_letter(self, response: str) -> Optional[str]:
        """The letter the response chooses, by the rules of the module docstring; None if none."""
        if has_boxed(response):
            content = extract_boxed(response)
            return None if content is None else self.letter_of(content)
        content = extract_answer_tag(response)
        if content is not None:
            return self.letter_of(content)
        phrases = list(self._phrase_re.finditer(response))
        if phrases:
            last = phrases[-1]
            return (last.group(1) or last.group(2)).upper()
        alone = self._alone_re.fullmatch(response)
        return alone.group(1).upper() if alone else None

    def reference_letter(self, ground_truth: Any, index: int) -> str:
        match = self._reference_re.fullmatch(ground_truth) if isinstance(ground_truth, str) else None
        if match is None:
            raise RewardInputError(
                f"reward 'multiple_choice': metadata[{index}]['ground_truth'] is {ground_truth!r}; "
                f"expected one option letter from {self.choices!r} (e.g. 'B'). Fix that row of the "
                f"prompt data, or set the reward's choices option"
            )
        return match.group(1).upper()

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(samples, prompts, metadata)
        texts = to_text_list(samples)
        references = [self.reference_letter(gt, i) for i, gt in enumerate(ground_truths(metadata, "multiple_choice"))]
        return [1.0 if self.chosen_letter(text) == ref else 0.0 for text, ref in zip(texts, references)]

    def __repr__(self) -> str:
        return f"MultipleChoiceScorer(choices={self.choices!r})"


@register_reward("multiple_choice")
def multiple_choice(*, choices: str = "ABCDE") -> MultipleChoiceScorer:
    """1.0 when the chosen option letter (\\boxed{}, <answer>, "answer is X", ...) is the reference."""
    return MultipleChoiceScorer(choices)
