"""Speech rate reward: words per second of the text a sample was asked to say, over the time it
took to say it; 1 inside a range, falling off outside it. A rule: no model, no weights.

    rate  = units(metadata[text_key]) / duration(audio)
    score = 1 inside [min_wps, max_wps], else the ratio of rate to the nearer end (2x off -> 0.5)

Units are the normalised text's words, or with `unit: characters` its characters (for Chinese).
The duration runs from the first to the last sample above `trim_below` (0.01, -40 dBFS), so
leading and trailing silence (and zero padding) do not count; silence scores 0. The default range,
2.0 to 3.5 words per second, surrounds conversational English's ~2.5. Options: `text_key`
(`spoken_text`), `min_wps`, `max_wps`, `unit`, `trim_below` (null: no trim), `sample_rate`.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import torch

from omni_rl.reward import register_reward
from rewards.audio_inputs import audio_clips, check_sample_rate
from rewards.transcripts import UNITS, reference_texts, text_units


def speaking_time(clip: torch.Tensor, rate: int, trim_below: float | None) -> float:
    """Seconds from the first to the last sample above `trim_below` in magnitude (the whole clip
    when None; 0 when no sample is above it)."""
    if trim_below is None:
        return clip.numel() / rate
    loud = torch.nonzero(clip.abs() > trim_below).flatten()
    if loud.numel() == 0:
        return 0.0
    return (int(loud[-1]) - int(loud[0]) + 1) / rate


def rate_score(rate: float, min_wps: float, max_wps: float) -> float:
    """1 inside [min_wps, max_wps], else the ratio to the nearer end (see the module docstring)."""
    if rate < min_wps:
        return rate / min_wps
    if rate > max_wps:
        return 0.0 if math.isinf(rate) else max_wps / rate
    return 1.0


class SpeechRateScorer:
    def __init__(self, text_key: str, min_wps: float, max_wps: float, unit: str, trim_below: float | None,
                 sample_rate: int | None):
        self.text_key, self.min_wps, self.max_wps = text_key, float(min_wps), float(max_wps)
        self.unit, self.trim_below, self.sample_rate = unit, trim_below, sample_rate

    def rates(self, clips: list[tuple[torch.Tensor, int]], texts: Sequence[str]) -> list[float]:
        """Units per second of each text over its clip's speaking time."""
        out = []
        for (clip, rate), text in zip(clips, texts):
            count = len(text_units(text, self.unit))
            seconds = speaking_time(clip, rate, self.trim_below)
            out.append(count / seconds if seconds > 0 else (math.inf if count else 0.0))
        return out

    def __call__(self, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        clips = audio_clips("speech_rate", samples, prompts, metadata, self.sample_rate)
        texts = reference_texts("speech_rate", metadata, self.text_key)
        return [rate_score(r, self.min_wps, self.max_wps) for r in self.rates(clips, texts)]


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def _check_options(*, text_key: str = "spoken_text", min_wps: float = 2.0, max_wps: float = 3.5, unit: str = "words",
                   trim_below: float | None = 0.01, sample_rate: int | None = None) -> None:
    if not isinstance(text_key, str) or not text_key:
        raise ValueError(f"text_key={text_key!r}; expected the metadata key holding the text to speak")
    if not _number(min_wps) or min_wps <= 0:
        raise ValueError(f"min_wps={min_wps!r}; expected a finite number > 0 (units per second)")
    if not _number(max_wps) or max_wps < min_wps:
        raise ValueError(f"max_wps={max_wps!r}; expected a finite number >= min_wps={min_wps!r}")
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}; expected one of {', '.join(UNITS)}")
    if trim_below is not None and (not _number(trim_below) or not 0 <= trim_below < 1):
        raise ValueError(f"trim_below={trim_below!r}; expected a magnitude in [0, 1) (0.01 = -40 dBFS) or null")
    check_sample_rate("speech_rate", sample_rate)


def _text_key(*, text_key: str = "spoken_text", **_: Any) -> set[str]:
    return {text_key}


@register_reward("speech_rate", modalities={"audio"}, check_options=_check_options, needs_metadata=_text_key)
def speech_rate(
    *, text_key: str = "spoken_text", min_wps: float = 2.0, max_wps: float = 3.5, unit: str = "words",
    trim_below: float | None = 0.01, sample_rate: int | None = None,
) -> SpeechRateScorer:
    """1 when metadata[text_key] is spoken at min_wps..max_wps units a second, else rate ratio."""
    return SpeechRateScorer(text_key, min_wps, max_wps, unit, trim_below, sample_rate)
