"""Cheap, weight-free video and audio statistics as rewards, for CPU demos and smoke tests.

Each takes a `MediaSamples`, ignores prompts and metadata, and has no options:
`temporal_smoothness` (1 - mean |frame[t+1] - frame[t]| / 255; still = 1), `video_brightness`
(mean pixel / 255) and `audio_loudness` (RMS; a full-scale square wave = 1). They show a loop
moving a number: maximising smoothness alone learns to stand still.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from omni_rl.reward import MediaSamples, RewardInputError, register_reward
from omni_rl.reward.inputs import check_prompts_metadata


def media_of(reward: str, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], stream: str) -> MediaSamples:
    if not isinstance(samples, MediaSamples) or getattr(samples, stream) is None:
        got = f"a MediaSamples without {stream}" if isinstance(samples, MediaSamples) else f"a {type(samples).__name__}"
        raise RewardInputError(
            f"{reward}: scores {stream}, but got {got}; pass MediaSamples({stream}=..., "
            f"{'fps' if stream == 'video' else 'sample_rate'}=...)"
        )
    check_prompts_metadata(len(samples), prompts, metadata, "samples", reward)
    return samples


def _temporal_smoothness(samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    video = media_of("temporal_smoothness", samples, prompts, metadata, "video").video
    if video.shape[1] == 1:
        return [1.0] * video.shape[0]
    # int16 holds the differences (-255..255); float64 sums keep large videos exact enough.
    diff = (video[:, 1:].to(torch.int16) - video[:, :-1].to(torch.int16)).abs()
    return (1.0 - diff.flatten(1).double().mean(dim=1) / 255.0).tolist()


def _video_brightness(samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    video = media_of("video_brightness", samples, prompts, metadata, "video").video
    return (video.flatten(1).double().mean(dim=1) / 255.0).tolist()


def _audio_loudness(samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    audio = media_of("audio_loudness", samples, prompts, metadata, "audio").audio
    clips = audio if isinstance(audio, list) else list(audio)
    return [float(clip.detach().double().pow(2).mean().sqrt()) for clip in clips]


@register_reward("temporal_smoothness", modalities={"video"})
def temporal_smoothness():
    """1 - mean absolute difference of consecutive frames / 255, in [0, 1]."""
    return _temporal_smoothness


@register_reward("video_brightness", modalities={"video"})
def video_brightness():
    """Mean pixel value / 255 over all frames, in [0, 1]."""
    return _video_brightness


@register_reward("audio_loudness", modalities={"audio"})
def audio_loudness():
    """RMS of each clip's waveform (full-scale square wave = 1)."""
    return _audio_loudness
