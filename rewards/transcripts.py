"""Text normalisation and error rates for the speech rewards (`asr_wer`, `speech_rate`).

`normalize_text` (applied to both sides, as Seed-TTS-eval does before jiwer): Unicode NFKC,
lowercase, every punctuation, symbol or control character replaced by a space, whitespace
collapsed; combining marks are kept (they carry vowels in Devanagari or Thai). `text_units` gives
words or characters (spaces removed, for CER); `error_rate` is (substitutions + deletions +
insertions) / reference units (0 for two empty texts, inf for an empty reference only), by a
two-row Levenshtein (`edit_distance`) rather than jiwer, whose own transforms differ;
`reference_texts` fetches each sample's `metadata[text_key]` or raises naming it.

Left out: traditional-to-simplified Chinese conversion, word alignments, spelling out numbers.
"""
from __future__ import annotations

import unicodedata
from typing import Any, Sequence

from omni_rl.reward import RewardInputError

UNITS = ("words", "characters")


def normalize_text(text: str) -> str:
    """NFKC, lowercase, punctuation, symbols and controls -> spaces, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" or unicodedata.category(c) == "Cc" else c for c in text)
    return " ".join(text.split())


def text_units(text: str, unit: str) -> list[str]:
    """The words of the normalised text, or its characters without the spaces."""
    normalized = normalize_text(text)
    if unit == "words":
        return normalized.split()
    if unit == "characters":
        return [c for c in normalized if not c.isspace()]
    raise ValueError(f"unit={unit!r}; expected one of {', '.join(UNITS)}")


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """The fewest substitutions, deletions and insertions turning `reference` into `hypothesis`."""
    # previous[j] = distance between reference[:i] and hypothesis[:j], for the row above.
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i]
        for j, hyp in enumerate(hypothesis, start=1):
            current.append(min(
                previous[j] + 1,                   # delete reference[i-1]
                current[j - 1] + 1,                # insert hypothesis[j-1]
                previous[j - 1] + (ref != hyp),    # substitute (free when equal)
            ))
        previous = current
    return previous[-1]


def error_rate(reference: str, hypothesis: str, unit: str) -> float:
    """WER ("words") or CER ("characters") of `hypothesis` against `reference`, normalised."""
    ref, hyp = text_units(reference, unit), text_units(hypothesis, unit)
    if not ref:
        return 0.0 if not hyp else float("inf")
    return edit_distance(ref, hyp) / len(ref)


def reference_texts(reward: str, metadata: Sequence[dict[str, Any]], text_key: str) -> list[str]:
    """`metadata[i][text_key]` for every sample; a missing or non-string one raises."""
    texts = []
    for i, meta in enumerate(metadata):
        if text_key not in meta:
            raise RewardInputError(
                f"{reward}: metadata[{i}] has no {text_key!r} (the text the sample was asked to speak); a talker "
                f"stage puts it there, or give each prompt a metadata.{text_key}; keys present: {sorted(meta)}"
            )
        text = meta[text_key]
        if not isinstance(text, str):
            raise RewardInputError(
                f"{reward}: metadata[{i}][{text_key!r}] has type {type(text).__name__}; expected the text as a str"
            )
        texts.append(text)
    return texts
