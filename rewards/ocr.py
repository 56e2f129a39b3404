"""OCR reward: how closely the text an OCR engine reads in the image matches the target text.

    score = 1 - min(levenshtein(recognised, target), len(target)) / len(target)      in [0, 1]

as in Flow-GRPO's text-rendering reward. Both strings are lower-cased and have all whitespace
removed before they are compared, so "Hello World" read as "HELLOWORLD" scores 1. An image in
which nothing is read scores 0, and so does one whose text is wholly wrong (the distance is
capped at the target's length).

The target of sample i is `metadata[i]["text"]` when present; otherwise it is the text inside
the first pair of double quotes of the prompt (`a sign that says "Hello World"` -> `Hello World`;
straight `"..."` or curly `\u201c...\u201d` quotes). A sample with neither raises, naming it:
scoring it 0 would silently teach the policy nothing.

The recognised text is what RapidOCR (`rapidocr-onnxruntime`, the PP-OCRv4 detection and
recognition models shipped inside the wheel; no download, CPU only, via onnxruntime) reads,
its boxes concatenated in reading order (top to bottom, then left to right). Boxes below
`min_confidence` are dropped. Flow-GRPO's scorer differs in one respect: it scores 0 distance
when the target appears anywhere inside the recognised text; here extra text costs its edits.

Options:
    min_confidence       drop recognised boxes scored below this (0..1, default 0.5, RapidOCR's own).
    det_limit_side_len   the detector resizes an image so that its longer side is this many
                         pixels (default 960, PaddleOCR's default). RapidOCR's own default
                         scales the *shorter* side up to 736, about 10x slower on wide images.
    use_angle_cls        run the 0/180-degree text orientation classifier (default False, as in
                         Flow-GRPO: generated text is upright).

The engine reads one image at a time (detection is per image; the recognised lines of an image
are batched inside RapidOCR), so a batch costs B engine calls, about 0.1 s each for a 512x512
image on one CPU core. Scores do not depend on how samples are batched.

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


def normalize_text(text: str) -> str:
    """Lower-case and drop all whitespace: the form both sides are compared in."""
    return _WHITESPACE.sub("", text).lower()


def ocr_target(prompt: str, meta: dict[str, Any], index: int) -> str:
    """The text sample `index` should show: `meta["text"]`, else the first quoted span of `prompt`."""
    if "text" in meta:
        target = meta["text"]
        if not isinstance(target, str):
            raise ValueError(
                f"ocr: metadata[{index}]['text'] is a {type(target).__name__} ({target!r}); expected the "
                f"target text as a string"
            )
        where = f"metadata[{index}]['text']"
    else:
        match = _QUOTED.search(prompt)
        if match is None:
            raise ValueError(
                f"ocr: sample {index} has no target text: its prompt {prompt!r} contains no quoted text "
                f"and metadata[{index}] has no 'text' key. Put the text to render in double quotes "
                f"(a sign that says \"Hello\") or pass metadata[{index}]['text']"
            )
        target = match.group(1) if match.group(1) is not None else match.group(2)
        where = f"the quotes of prompt {prompt!r}"
    if not normalize_text(target):
        raise ValueError(
            f"ocr: sample {index}: the target text from {where} is empty after removing whitespace "
            f"({target!r}); a target needs at least one visible character"
        )
    return target


def ocr_score(recognised: str, target: str) -> float:
    """1 - min(levenshtein, len(target)) / len(target) on the normalised strings."""
    recognised, target = normalize_text(recognised), normalize_text(target)
    distance = min(levenshtein(recognised, target), len(target))
    return 1.0 - distance / len(target)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class OcrScorer:
    """Reads each image with RapidOCR and scores it against its target text."""

    def __init__(self, min_confidence: float, det_limit_side_len: int, use_angle_cls: bool):
        if not _is_real(min_confidence) or not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"ocr: min_confidence={min_confidence!r}; expected a number in [0, 1] (default 0.5)")
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
        self.engine = RapidOCR(
            text_score=float(min_confidence),
            det_limit_side_len=int(det_limit_side_len),
            det_limit_type="max",
        )

    def read(self, image: np.ndarray) -> str:
        """The text RapidOCR reads in one RGB uint8 [H, W, 3] image, boxes in reading order."""
        # RapidOCR takes numpy input as OpenCV's BGR.
        result, _ = self.engine(np.ascontiguousarray(image[..., ::-1]), use_cls=self.use_angle_cls)
        if not result:
            return ""
        return "".join(text for _box, text, _confidence in result)

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        # Targets first: a missing one fails before any OCR time is spent.
        targets = [ocr_target(p, m, i) for i, (p, m) in enumerate(zip(prompts, metadata))]
        pixels = to_uint8_numpy(images)
        return [ocr_score(self.read(image), target) for image, target in zip(pixels, targets)]


@register_reward("ocr")
def ocr(*, min_confidence: float = 0.5, det_limit_side_len: int = 960, use_angle_cls: bool = False) -> OcrScorer:
    """Text-rendering accuracy in [0, 1]: 1 - normalised edit distance to the quoted target."""
    return OcrScorer(min_confidence, det_limit_side_len, use_angle_cls)
