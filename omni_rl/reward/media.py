"""`MediaSamples`: the typed batch a video or audio(-video) generator hands to its rewards.

    MediaSamples(video=..., fps=24.0, audio=float [B, C, S], sample_rate=48000)  # LTX-2

Checked when built (`RewardInputError` naming the field), never converted silently; `frames(k)`,
`mono()`, `split()` / `cat()` serve the rewards. Left out: per-sample rates, resampling.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from omni_rl.reward.inputs import RewardInputError

Audio = Union[torch.Tensor, Sequence[torch.Tensor]]

VIDEO = "video"
AUDIO = "audio"


def frame_indices(num_frames: int, k: int) -> list[int]:
    """k evenly spaced indices into `num_frames` frames, first (0) and last (T - 1) included
    for k >= 2: round(i * (T - 1) / (k - 1)), halves rounded up. k = 1 gives [0]; k > T repeats
    frames (T = 2, k = 4: [0, 0, 1, 1]), so every frame still counts about equally."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise RewardInputError(f"frames: k={k!r}; expected an int >= 1 (frames per video)")
    if k == 1:
        return [0]
    span = num_frames - 1
    # Integer form of floor(i * span / (k - 1) + 1/2): exact, no float ties.
    return [(2 * i * span + (k - 1)) // (2 * (k - 1)) for i in range(k)]


@dataclass(frozen=True)
class MediaSamples:
    """A batch of B generated videos and/or audio clips; see the module docstring."""

    video: Optional[torch.Tensor] = None
    fps: Optional[float] = None
    audio: Optional[Audio] = None
    sample_rate: Optional[int] = None

    def __post_init__(self) -> None:
        if self.video is None and self.audio is None:
            raise RewardInputError(
                "MediaSamples has neither video nor audio; pass video=uint8 [B, T, H, W, C] with fps, "
                "and/or audio=float [B, S] / [B, C, S] with sample_rate"
            )
        sizes = {}
        if self.video is not None:
            sizes[VIDEO] = _check_video(self.video)
            object.__setattr__(self, "fps", _check_fps(self.fps))
        elif self.fps is not None:
            raise RewardInputError(f"MediaSamples.fps={self.fps!r} but video is None; pass the video with its fps")
        if self.audio is not None:
            audio, sizes[AUDIO] = _check_audio(self.audio)
            object.__setattr__(self, "audio", audio)
            object.__setattr__(self, "sample_rate", _check_sample_rate(self.sample_rate))
        elif self.sample_rate is not None:
            raise RewardInputError(
                f"MediaSamples.sample_rate={self.sample_rate!r} but audio is None; pass the audio with its sample_rate"
            )
        if len(set(sizes.values())) > 1:
            raise RewardInputError(
                f"MediaSamples: video has {sizes[VIDEO]} samples but audio has {sizes[AUDIO]}; expected one audio "
                f"track per video (the same batch size B)"
            )

    def __len__(self) -> int:
        return int(self.video.shape[0]) if self.video is not None else len(self.audio)

    @property
    def modalities(self) -> frozenset[str]:
        """The streams present: a subset of {"video", "audio"}."""
        return frozenset(
            name for name, value in ((VIDEO, self.video), (AUDIO, self.audio)) if value is not None
        )

    def frames(self, k: int) -> torch.Tensor:
        """uint8 [B * k, H, W, C]: k evenly spaced frames of every video (`frame_indices`),
        video 0's k frames first, then video 1's, and so on."""
        if self.video is None:
            raise RewardInputError("MediaSamples.frames: there is no video (audio only)")
        index = torch.tensor(frame_indices(int(self.video.shape[1]), k), device=self.video.device)
        return self.video.index_select(1, index).flatten(0, 1)

    def split(self) -> list["MediaSamples"]:
        """B MediaSamples of one sample each (views, no copies)."""
        return [self._select(i) for i in range(len(self))]

    def _select(self, i: int) -> "MediaSamples":
        video = self.video[i:i + 1] if self.video is not None else None
        if self.audio is None:
            audio = None
        else:
            audio = [self.audio[i]] if isinstance(self.audio, list) else self.audio[i:i + 1]
        return MediaSamples(video=video, fps=self.fps, audio=audio, sample_rate=self.sample_rate)

    @classmethod
    def cat(cls, parts: Sequence["MediaSamples"]) -> "MediaSamples":
        """Join batches with the same streams, fps and sample rate. Videos must share their
        [T, H, W, C]; audio stays one tensor when every part's clips share a shape, else becomes
        a list of clips."""
        if not parts or not all(isinstance(p, MediaSamples) for p in parts):
            raise RewardInputError("MediaSamples.cat: expected a non-empty list of MediaSamples")
        first = parts[0]
        for j, part in enumerate(parts):
            same = (part.modalities, part.fps, part.sample_rate) == (first.modalities, first.fps, first.sample_rate)
            if not same:
                raise RewardInputError(
                    f"MediaSamples.cat: part {j} has streams {sorted(part.modalities)}, fps={part.fps}, "
                    f"sample_rate={part.sample_rate}; part 0 has {sorted(first.modalities)}, fps={first.fps}, "
                    f"sample_rate={first.sample_rate}; only batches of one kind join"
                )
        video = None
        if first.video is not None:
            shapes = {tuple(p.video.shape[1:]) for p in parts}
            if len(shapes) > 1:
                raise RewardInputError(
                    f"MediaSamples.cat: the videos have different [T, H, W, C] {sorted(shapes)}; score them in "
                    f"separate calls"
                )
            video = torch.cat([p.video for p in parts])
        audio = None
        if first.audio is not None:
            tensors = [p.audio for p in parts if isinstance(p.audio, torch.Tensor)]
            if len(tensors) == len(parts) and len({tuple(t.shape[1:]) for t in tensors}) == 1:
                audio = torch.cat(tensors)
            else:
                audio = [clip for p in parts for clip in (p.audio if isinstance(p.audio, list) else list(p.audio))]
        return cls(video=video, fps=first.fps, audio=audio, sample_rate=first.sample_rate)

    def mono(self) -> list[torch.Tensor]:
        """B 1-D float32 CPU clips: the channels of each clip averaged (mono input stays as is)."""
        if self.audio is None:
            raise RewardInputError("MediaSamples.mono: there is no audio (video only)")
        clips = self.audio if isinstance(self.audio, list) else list(self.audio)
        return [(clip.mean(dim=0) if clip.ndim == 2 else clip).detach().to("cpu", torch.float32) for clip in clips]


def _check_video(video: object) -> int:
    if not isinstance(video, torch.Tensor):
        raise RewardInputError(
            f"MediaSamples.video has type {type(video).__name__}; expected a torch.uint8 tensor [B, T, H, W, C] "
            f"(torch.from_numpy for a numpy array)"
        )
    if video.dtype != torch.uint8:
        raise RewardInputError(
            f"MediaSamples.video has dtype {video.dtype}; expected uint8 0..255. Convert [0, 1] floats with "
            f"(video.clamp(0, 1) * 255).round().to(torch.uint8)"
        )
    shape = tuple(video.shape)
    if len(shape) != 5:
        hint = " (one video? add the batch dim: video[None])" if len(shape) == 4 else ""
        raise RewardInputError(f"MediaSamples.video has shape {shape}; expected 5 dims [B, T, H, W, C]{hint}")
    if shape[-1] not in (1, 3):
        hint = " (channels first? use video.permute(0, 1, 3, 4, 2))" if shape[2] in (1, 3) else ""
        raise RewardInputError(
            f"MediaSamples.video has shape {shape}; expected C = 3 (RGB) or 1 (grey) last in [B, T, H, W, C]{hint}"
        )
    if 0 in shape:
        raise RewardInputError(f"MediaSamples.video has shape {shape}; expected B, T, H, W >= 1")
    return shape[0]


def _check_fps(fps: object) -> float:
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not math.isfinite(fps) or not fps > 0:
        raise RewardInputError(
            f"MediaSamples.fps={fps!r}; expected the video's frames per second, a finite number > 0"
        )
    return float(fps)


def _check_sample_rate(rate: object) -> int:
    if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
        raise RewardInputError(f"MediaSamples.sample_rate={rate!r}; expected the audio's rate in Hz, an int > 0")
    return int(rate)


def _check_audio(audio: object) -> tuple[Audio, int]:
    """Return (the audio, a list when it was a list or tuple; B)."""
    if isinstance(audio, torch.Tensor):
        if audio.ndim not in (2, 3):
            hint = " (one clip? add the batch dim: audio[None])" if audio.ndim == 1 else ""
            raise RewardInputError(
                f"MediaSamples.audio has shape {tuple(audio.shape)}; expected [B, S] or [B, C, S]{hint}"
            )
        _check_clip("MediaSamples.audio", audio, batched=True)
        return audio, int(audio.shape[0])
    if isinstance(audio, (list, tuple)):
        if not audio:
            raise RewardInputError("MediaSamples.audio is an empty list; expected one clip per sample")
        for i, clip in enumerate(audio):
            if not isinstance(clip, torch.Tensor):
                raise RewardInputError(
                    f"MediaSamples.audio[{i}] has type {type(clip).__name__}; expected a float tensor [S] or [C, S]"
                )
            if clip.ndim not in (1, 2):
                raise RewardInputError(
                    f"MediaSamples.audio[{i}] has shape {tuple(clip.shape)}; expected [S] (mono) or [C, S]"
                )
            _check_clip(f"MediaSamples.audio[{i}]", clip, batched=False)
        return list(audio), len(audio)
    raise RewardInputError(
        f"MediaSamples.audio has type {type(audio).__name__}; expected a float tensor [B, S] / [B, C, S] or a "
        f"list of B float tensors [S] / [C, S]"
    )


def _check_clip(field: str, clip: torch.Tensor, batched: bool) -> None:
    if not clip.is_floating_point():
        raise RewardInputError(
            f"{field} has dtype {clip.dtype}; expected float samples in [-1, 1] (int16 PCM: divide by 32768)"
        )
    if 0 in clip.shape:
        expected = "B, S >= 1" + (" and C >= 1" if clip.ndim == 3 else "") if batched else "a non-empty clip"
        raise RewardInputError(f"{field} has shape {tuple(clip.shape)}; expected {expected}")
    if not torch.isfinite(clip).all():
        raise RewardInputError(f"{field} contains NaN or inf samples; expected a finite waveform")
