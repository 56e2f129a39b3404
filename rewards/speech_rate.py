"""Speech rate reward: words per second of the text a sample was asked to say, over the time it
took to say it; 1 inside a range, falling off outside it. A rule: no model, no weights.

    rate  = units(metadata[text_key]) / duration(audio)
    score = 1                  if min_wps <= rate <= max_wps
          = rate / min_wps     if rate < min_wps     (half the slowest rate allowed -> 0.5)
          = max_wps / rate     if rate > max_wps     (twice the fastest rate allowed -> 0.5)

in [0, 1]: the ratio of the rate to the nearest end of the range, so the fall-off is the same for
speech 2x too slow and 2x too fast, and needs no scale of its own. Units are the words of the
normalised text (`rewards.transcripts`: punctuation stripped, so "Hello, world!" is 2 words), or
with `unit: characters` its characters without spaces (for Chinese; then min_wps and max_wps are
characters per second: about 3.5 to 5.5 for Mandarin read aloud).

Duration: from the first to the last sample whose magnitude exceeds `trim_below` (inclusive),
over the sample rate: leading and trailing silence do not count (a policy cannot slow its rate
by padding with silence, and a batch zero-padded to one length keeps each clip's own duration);
pauses inside the speech do. `trim_below: null` counts the whole clip. A clip with nothing above
`trim_below` (silence) has duration 0: with words to say its rate is infinite (score 0), and
with none the rate is 0 (score 0).

Default range 2.0 to 3.5 words per second (120 to 210 words a minute), around the ~150 words a
minute (2.5 per second) of conversational English; narrow it to the voice you want.

Options:
    text_key     the metadata key holding the text the sample was asked to say (default `spoken_text`).
    min_wps      the slowest rate scored 1 (default 2.0), > 0.
    max_wps      the fastest rate scored 1 (default 3.5), >= min_wps.
    unit         `words` (default) or `characters`.
    trim_below   the magnitude (full scale 1) at or below which leading and trailing samples are
                 silence (default 0.01, -40 dBFS); null: no trimming.
    sample_rate  the rate of clips whose metadata has no `sample_rate` (default None).

Audio input: the contract of `rewards.audio_inputs` (a `MediaSamples` with audio, or mono clips
with their rates); channels are averaged before trimming.
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
