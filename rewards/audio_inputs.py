"""The audio input contract of the audio rewards (CLAP, ImageBind).

`audio_clips(reward, samples, prompts, metadata, sample_rate)` returns one (1-D float32 CPU clip,
rate) per prompt from a `MediaSamples` (mixed to mono, at its rate), a float `[B, L]` tensor or
array, or a list of 1-D clips, each at `metadata[i]["sample_rate"]` or the option. Multi-channel
clips, integer PCM, NaN, a missing rate or mismatched lengths raise `RewardInputError` naming the
reward and the clip; `check_sample_rate` checks the option when the reward is built.

Left out on purpose: resampling (`omni_rl.utils.audio`) and decoding audio files.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np
import torch

from omni_rl.reward import MediaSamples, RewardInputError
from omni_rl.reward.inputs import check_prompts_metadata


def audio_clips(
    reward: str, samples: Any, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], sample_rate: int | None,
) -> list[tuple[torch.Tensor, int]]:
    """Check one call's inputs; return the clips of `samples` as (1-D float32 CPU tensor, sample
    rate) pairs. See the module docstring for the contract."""
    if isinstance(samples, MediaSamples):
        if samples.audio is None:
            raise RewardInputError(
                f"{reward}: the MediaSamples hold no audio (only video); this reward scores audio: pass "
                f"MediaSamples(audio=..., sample_rate=...)"
            )
        check_prompts_metadata(len(samples), prompts, metadata, "samples", reward)
        # The container checked dtype, shape and finiteness when it was built.
        return [(clip, samples.sample_rate) for clip in samples.mono()]
    if isinstance(samples, (torch.Tensor, np.ndarray)):
        if samples.ndim != 2:
            hint = " (multi-channel? mix down first: audio.mean(dim=1))" if samples.ndim == 3 else ""
            hint = " (one clip? add the batch dim: audio[None])" if samples.ndim == 1 else hint
            raise RewardInputError(
                f"{reward}: audio has shape {tuple(samples.shape)}; expected [B, L] mono clips{hint}"
            )
        clips = list(samples)
    elif isinstance(samples, (list, tuple)):
        clips = list(samples)
    else:
        raise RewardInputError(
            f"{reward}: samples has type {type(samples).__name__}; expected audio as a float tensor [B, L] or a "
            f"list of 1-D float tensors/arrays"
        )
    if not clips:
        raise RewardInputError(f"{reward}: the batch is empty; a reward needs at least one clip")
    check_prompts_metadata(len(clips), prompts, metadata, "samples", reward)
    out = []
    for i, clip in enumerate(clips):
        if isinstance(clip, np.ndarray):
            clip = torch.from_numpy(np.ascontiguousarray(clip))
        if not isinstance(clip, torch.Tensor):
            raise RewardInputError(
                f"{reward}: audio[{i}] has type {type(clip).__name__}; expected a 1-D float tensor or numpy array"
            )
        if not clip.is_floating_point():
            raise RewardInputError(
                f"{reward}: audio[{i}] has dtype {clip.dtype}; expected float samples in [-1, 1] "
                f"(int16 PCM: divide by 32768)"
            )
        if clip.ndim != 1 or clip.numel() == 0:
            raise RewardInputError(
                f"{reward}: audio[{i}] has shape {tuple(clip.shape)}; expected a non-empty 1-D mono clip "
                f"(mix stereo down with clip.mean(dim=0))"
            )
        clip = clip.detach().to("cpu", torch.float32)
        if not torch.isfinite(clip).all():
            raise RewardInputError(f"{reward}: audio[{i}] contains NaN or inf samples")
        rate = metadata[i].get("sample_rate", sample_rate)
        if rate is None:
            raise RewardInputError(
                f"{reward}: audio[{i}] has no sample rate; put it in metadata[{i}]['sample_rate'] or pass the "
                f"reward option sample_rate=..."
            )
        if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
            raise RewardInputError(
                f"{reward}: the sample rate of audio[{i}] is {rate!r}; expected a positive integer (Hz)"
            )
        out.append((clip, int(rate)))
    return out


def check_sample_rate(reward: str, sample_rate: Any) -> None:
    if sample_rate is None:
        return
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral) or sample_rate <= 0:
        raise ValueError(f"{reward}: sample_rate={sample_rate!r}; expected a positive integer (Hz) or None")
