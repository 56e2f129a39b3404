"""ImageBind's input pipeline, written with torch only: audio clips -> normalised log-mel images,
video -> normalised 2-frame clips in three spatial crops, prompts -> CLIP BPE ids.

As ImageBind's own loaders: audio at 16 kHz is cut into `n_clips` (3) evenly spread 2 s clips,
each a Kaldi-style 128-bin log-mel filter bank (`log_mel`: 25 ms Hann frames every 10 ms,
pre-emphasis 0.97, 20 Hz to Nyquist) padded or cut to 204 frames and normalised (mean -4.268,
std 9.138); video gives `n_clips` (5) evenly spread 2 s clips of two frames, short side resized to
224 (bilinear, no antialiasing), CLIP-normalised, in 3 square crops; text is
`<|startoftext|> prompt <|endoftext|>` truncated (end token kept) and zero-padded.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Sequence

import torch

AUDIO_RATE = 16000
AUDIO_CLIP_SECONDS = 2
AUDIO_MEAN, AUDIO_STD = -4.268, 9.138
VIDEO_CLIP_SECONDS = 2
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_FRAME_LENGTH = 400  # 25 ms at 16 kHz
_FRAME_SHIFT = 160  # 10 ms
_N_FFT = 512  # the frame length rounded up to a power of two, as Kaldi pads it
_PREEMPHASIS = 0.97


def clip_starts(duration: Fraction, clip_seconds: Fraction, n_clips: int) -> list[Fraction]:
    """Start times of `n_clips` clips spread evenly so the last one ends at `duration`
    (all start at 0 when the media is no longer than a clip)."""
    span = max(duration - clip_seconds, Fraction(0))
    step = span / max(n_clips - 1, 1)
    return [step * i for i in range(n_clips)]


def _mel(freq: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(freq / 700.0)


@functools.lru_cache(maxsize=4)
def mel_banks(num_bins: int, sample_rate: int = AUDIO_RATE, n_fft: int = _N_FFT, low_hz: float = 20.0) -> torch.Tensor:
    """Kaldi's triangular mel filters [num_bins, n_fft // 2 + 1] (the Nyquist bin gets weight 0)."""
    nyquist = sample_rate / 2
    mel_low = _mel(torch.tensor(low_hz, dtype=torch.float64))
    mel_high = _mel(torch.tensor(nyquist, dtype=torch.float64))
    delta = (mel_high - mel_low) / (num_bins + 1)
    left = mel_low + delta * torch.arange(num_bins, dtype=torch.float64)[:, None]
    centre, right = left + delta, left + 2 * delta
    bin_mel = _mel(torch.arange(n_fft // 2, dtype=torch.float64) * sample_rate / n_fft)[None, :]
    up = (bin_mel - left) / (centre - left)
    down = (right - bin_mel) / (right - centre)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return torch.nn.functional.pad(banks, (0, 1)).float()


def log_mel(wave: torch.Tensor, num_mel_bins: int) -> torch.Tensor:
    """Kaldi-compatible log-mel filter bank of a 16 kHz mono clip: [num_mel_bins, frames].

    Written with `torch.fft.rfft` on explicit frames rather than `torch.stft`, because Kaldi
    removes each frame's DC offset and pre-emphasises it *before* the window, which a fused STFT
    cannot do.
    """
    if wave.shape[-1] < _FRAME_LENGTH:
        return wave.new_zeros(num_mel_bins, 0)
    frames = wave.unfold(-1, _FRAME_LENGTH, _FRAME_SHIFT)  # [F, 400], no edge padding
    frames = frames - frames.mean(dim=-1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=-1)  # x[-1] := x[0]
    frames = (frames - _PREEMPHASIS * previous) * torch.hann_window(_FRAME_LENGTH, periodic=False, dtype=wave.dtype)
    power = torch.fft.rfft(frames, n=_N_FFT).abs().pow(2)  # [F, 257]
    energies = power @ mel_banks(num_mel_bins).to(power).T
    return energies.clamp(min=torch.finfo(torch.float32).eps).log().T


def audio_clip_bounds(n_samples: int, n_clips: int) -> list[tuple[int, int]]:
    """[begin, end) sample indices of the 2 s clips of a 16 kHz waveform of `n_samples`."""
    starts = clip_starts(Fraction(n_samples, AUDIO_RATE), Fraction(AUDIO_CLIP_SECONDS), n_clips)
    return [(int(s * AUDIO_RATE), int((s + AUDIO_CLIP_SECONDS) * AUDIO_RATE)) for s in starts]


def audio_features(wave: torch.Tensor, *, num_mel_bins: int, target_len: int, n_clips: int) -> torch.Tensor:
    """A 16 kHz mono waveform [L] -> normalised log-mel clips [n_clips, 1, num_mel_bins, target_len]."""
    clips = []
    for begin, end in audio_clip_bounds(wave.shape[-1], n_clips):
        clip = wave[begin:end]
        mel = log_mel(clip - clip.mean(), num_mel_bins)
        mel = torch.nn.functional.pad(mel, (0, max(0, target_len - mel.shape[-1])))[:, :target_len]
        clips.append((mel - AUDIO_MEAN) / AUDIO_STD)
    return torch.stack(clips)[:, None]


def _short_side_resize(video: torch.Tensor, size: int) -> torch.Tensor:
    """[C, T, H, W] float -> short side `size`, the long side scaled by the same factor (floored)."""
    h, w = video.shape[-2:]
    new_h, new_w = (int(math.floor(h / w * size)), size) if w < h else (size, int(math.floor(w / h * size)))
    return torch.nn.functional.interpolate(video, size=(new_h, new_w), mode="bilinear", align_corners=False)


def _three_crops(video: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Square crops at the start, centre and end of the long side of [C, T, H, W]."""
    h, w = video.shape[-2:]
    y, x = math.ceil((h - size) / 2), math.ceil((w - size) / 2)
    crops = []
    for index in range(3):
        yi, xi = y, x
        if h > w:
            yi = (0, y, h - size)[index]
        else:
            xi = (0, x, w - size)[index]
        crops.append(video[..., yi:yi + size, xi:xi + size])
    return crops


def clip_frame_indices(total: int, fps: float, n_clips: int) -> list[tuple[int, int]]:
    """(first, last) frame of each 2 s clip of a `total`-frame video: the first and last frame
    whose time i / fps lies in [start, start + 2 s)."""
    rate = Fraction(fps)
    starts = clip_starts(Fraction(total) / rate, Fraction(VIDEO_CLIP_SECONDS), n_clips)
    out = []
    for start in starts:
        first = min(math.ceil(start * rate), total - 1)
        last = min(max(math.ceil((start + VIDEO_CLIP_SECONDS) * rate) - 1, first), total - 1)
        out.append((first, last))
    return out


def video_features(frames: torch.Tensor, fps: float, *, image_size: int, n_clips: int) -> torch.Tensor:
    """uint8 frames [T, H, W, 3] at `fps` -> normalised clips [n_clips * 3, 3, 2, S, S]."""
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1, 1)
    out = []
    for first, last in clip_frame_indices(frames.shape[0], fps, n_clips):
        clip = frames[[first, last]].permute(3, 0, 1, 2).float() / 255.0  # [3, 2, H, W]
        clip = (_short_side_resize(clip, image_size) - mean) / std
        out.extend(_three_crops(clip, image_size))
    return torch.stack(out)


def tokenize(tokenizer, prompts: Sequence[str], context_length: int) -> torch.Tensor:
    """CLIP BPE ids [B, context_length]: start, prompt, end (kept when truncating), zero padding."""
    ids = tokenizer(list(prompts), truncation=True, max_length=context_length)["input_ids"]
    out = torch.zeros(len(ids), context_length, dtype=torch.long)
    for i, row in enumerate(ids):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out
