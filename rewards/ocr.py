"""OCR reward: how closely the text an OCR engine reads in the image matches the target text.

The target is `metadata[i]["text"]` or the prompt's first quoted span (a prompt with neither is
refused when the prompts load); the recognised text is RapidOCR's (PP-OCRv4 on onnxruntime, CPU,
shipped in the wheel). `rule: flow_grpo` (default) is Flow-GRPO's scorer, 1 when the target is
inside the recognised text, else 1 - capped Levenshtein / target length; `rule: edit_distance` is
the rule before, without the substring match. Which rule a number was measured with is part of
the number (docs/models.md, Reward details). Options: `rule`, `min_confidence` (None: the rule's
own), `det_limit_side_len` (960), `use_angle_cls` (False).

Extra: `pip install rapidocr-onnxruntime` (the `ocr` extra).
"""
from __future__ import annotations

import numbers
import re
from typing import Any, Sequence

import numpy as np

from omni_rl.reward import Images, check_batch, register_reward, to_uint8_numpy

# The first quoted span of a prompt: straight double quotes, or curly ones.
_QUOTED = re.compile(r'"([^"]*)"|\u201c([^\u201d]*)\u201d')
_WHITESPACE = re.compile(r"\s+")


def levenshtein(a: str, b: str) -> int:
    """Edit distance between `a` and `b` (insertions, deletions, substitutions, each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    # Two rows of the dynamic-programming table; `previous[j]` = distance(a[:i], b[:j]).
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


RULES = ("flow_grpo", "edit_distance")
# The confidence a box needs under each rule when min_confidence is None: Flow-GRPO keeps every
# box scored above 0; the old rule dropped those below RapidOCR's default 0.5.
_RULE_MIN_CONFIDENCE = {"flow_grpo": 0.0, "edit_distance": 0.5}


def normalize_text(text: str, rule: str = "edit_distance") -> str:
    """The form both sides are compared in: lower-cased, without spaces (`flow_grpo`, as
    Flow-GRPO's `replace(" ", "")`) or without any whitespace (`edit_distance`)."""
    if rule == "flow_grpo":
        return text.replace(" ", "").lower()
    return _WHITESPACE.sub("", text).lower()


def ocr_target(prompt: str, meta: dict[str, Any], index: int) -> str:
    """The text sample `index` should show: `meta["text"]`, else the first quoted span of `prompt`;
    a ValueError naming the sample when there is none."""
    target, reason = _target(prompt, meta)
    if reason is not None:
        raise ValueError(f"ocr: sample {index} {reason}")
    return target


def _target(prompt: str, meta: dict[str, Any]) -> tuple[str, None] | tuple[None, str]:
    """(target, None), or (None, why there is none) for a prompt and its metadata."""
    if "text" in meta:
        target = meta["text"]
        if not isinstance(target, str):
            return None, (f"has metadata['text'] of type {type(target).__name__} ({target!r}); expected the "
                          f"target text as a string")
        where = "metadata['text']"
    else:
        match = _QUOTED.search(prompt)
        if match is None:
            return None, (f"has no target text: its prompt {prompt[:80]!r} contains no quoted text and its "
                          f"metadata has no 'text' key. Put the text to render in double quotes (a sign that "
                          f"says \"Hello\") or give each row a 'text' field")
        target = match.group(1) if match.group(1) is not None else match.group(2)
        where = f"the quotes of prompt {prompt[:80]!r}"
    if not normalize_text(target):
        return None, (f"has an empty target: the text from {where} is empty after removing whitespace "
                      f"({target!r}); a target needs at least one visible character")
    return target, None


def ocr_score(recognised: str, target: str, rule: str = "flow_grpo") -> float:
    """The score of `recognised` against `target` under `rule` (module docstring): on the
    normalised strings, 1 when the target is inside the recognised text (`flow_grpo` only),
    else 1 - min(levenshtein, len(target)) / len(target)."""
    if rule not in RULES:
        raise ValueError(f"ocr: rule={rule!r}; expected one of {list(RULES)}")
    recognised, target = normalize_text(recognised, rule), normalize_text(target, rule)
    if not target:
        raise ValueError(f"ocr: the target is empty under rule {rule!r}; a target needs a visible character")
    if rule == "flow_grpo" and target in recognised:
        return 1.0
    distance = min(levenshtein(recognised, target), len(target))
    return 1.0 - distance / len(target)


def check_ocr_item(prompt: str, metadata: dict[str, Any]) -> str | None:
    """Why this prompt has no target the reward can read, or None when it has one: run on every
    prompt when the prompts load (`register_reward(check_item=...)`)."""
    return _target(prompt, metadata)[1]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class OcrScorer:
    """Reads each image with RapidOCR and scores it against its target text."""

    def __init__(self, rule: str, min_confidence: float | None, det_limit_side_len: int, use_angle_cls: bool):
        _check_options(rule=rule, min_confidence=min_confidence)
        if not _is_int(det_limit_side_len) or det_limit_side_len < 32:
            raise ValueError(
                f"ocr: det_limit_side_len={det_limit_side_len!r}; expected an int >= 32 (default 960)"
            )
        if not isinstance(use_angle_cls, bool):
            raise ValueError(f"ocr: use_angle_cls={use_angle_cls!r}; expected True or False")
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as err:
            raise ImportError(
                f"the ocr reward needs the RapidOCR engine, which is not installed ({err}); install it "
                f"with `pip install rapidocr-onnxruntime` (or `pip install -e .[ocr]`)"
            ) from err
        self.use_angle_cls = use_angle_cls
        self.rule = rule
        self.min_confidence = min_confidence
        self.engine = RapidOCR(
            # Every box comes back; `read` keeps those the rule counts (RapidOCR drops only
            # boxes below its text_score, so it cannot say "above 0").
            text_score=0.0,
            det_limit_side_len=int(det_limit_side_len),
            det_limit_type="max",
        )

    def read(self, image: np.ndarray) -> str:
        """The text RapidOCR reads in one RGB uint8 [H, W, 3] image, boxes in reading order."""
        # RapidOCR takes numpy input as OpenCV's BGR.
        result, _ = self.engine(np.ascontiguousarray(image[..., ::-1]), use_cls=self.use_angle_cls)
        if not result:
            return ""
        return "".join(text for _box, text, confidence in result if self.counts(float(confidence)))

    def counts(self, confidence: float) -> bool:
        """Whether a box read with `confidence` counts: above 0 under `flow_grpo`'s default, at least
        0.5 under `edit_distance`'s, at least `min_confidence` when it is given."""
        if self.min_confidence is None and self.rule == "flow_grpo":
            return confidence > 0.0
        floor = _RULE_MIN_CONFIDENCE[self.rule] if self.min_confidence is None else self.min_confidence
        return confidence >= floor

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        # Targets first: a missing one fails before any OCR time is spent.
        targets = [ocr_target(p, m, i) for i, (p, m) in enumerate(zip(prompts, metadata))]
        pixels = to_uint8_numpy(images)
        return [ocr_score(self.read(image), target, self.rule) for image, target in zip(pixels, targets)]


def _check_options(*, rule: str = "flow_grpo", min_confidence: float | None = None, **_: Any) -> None:
    if rule not in RULES:
        raise ValueError(f"ocr: rule={rule!r}; expected one of {list(RULES)} (default flow_grpo, Flow-GRPO's scorer)")
    if min_confidence is not None and (not _is_real(min_confidence) or not 0.0 <= min_confidence <= 1.0):
        raise ValueError(
            f"ocr: min_confidence={min_confidence!r}; expected a number in [0, 1], or null for the rule's own "
            f"(above 0 for flow_grpo, 0.5 for edit_distance)"
        )


@register_reward("ocr", check_options=_check_options, check_item=check_ocr_item)
def ocr(*, rule: str = "flow_grpo", min_confidence: float | None = None, det_limit_side_len: int = 960,
        use_angle_cls: bool = False) -> OcrScorer:
    """Text-rendering accuracy in [0, 1] against the quoted target, by Flow-GRPO's rule (a
    target inside the recognised text scores 1) or `rule: edit_distance`."""
    return OcrScorer(rule, min_confidence, det_limit_side_len, use_angle_cls)
