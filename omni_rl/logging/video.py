"""Sample videos: mp4 files (with an optional audio track), contact sheets and animated GIFs.

`save_video` writes an H.264 mp4 (BT.709) with an optional AAC track, atomically;
`contact_sheet`, `video_grid` and `gif_bytes` make pictures. Frames are uint8 `[T, H, W, 3]`.
Left out on purpose: reading videos, downscaling, audio resampling (`omni_rl.utils.audio`).
"""
from __future__ import annotations

import io
import math
import numbers
import os
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from omni_rl.logging.gallery import make_grid
from omni_rl.utils.atomic import atomic_write_bytes

# x264's constant-rate factor: 18 is near transparent for generated samples judged by eye;
# the default, 23, smears fine texture that rewards such as OCR look at.
_CRF = 18
# Sample rates ffmpeg's native AAC encoder takes (av.Codec("aac", "w").audio_rates).
AAC_SAMPLE_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
# Frames taller than this are shrunk for a contact sheet: 8 frames of 720p video side by side
# would make a 10,000-pixel-wide picture.
_SHEET_FRAME_HEIGHT = 256
# GIF frame delays are whole hundredths of a second, and browsers show delays under 20 ms as
# 100 ms: a faster video would play five times slower, not faster.
_GIF_MIN_DELAY_MS = 20


def _frames_array(frames: Any, what: str) -> np.ndarray:
    """`frames` as a contiguous uint8 numpy array [T, H, W, 3], or a ValueError naming `what`."""
    array = frames.detach().cpu().numpy() if hasattr(frames, "detach") else np.asarray(frames)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(
            f"{what} expects uint8 frames shaped [T, H, W, 3] (RGB, channels last), got dtype "
            f"{array.dtype} shape {tuple(array.shape)}; convert floats in [0, 1] with "
            f"(x.clamp(0, 1) * 255).round().to(torch.uint8), move channels last "
            f"(x.permute(0, 2, 3, 1)), and repeat a gray channel three times"
        )
    if 0 in array.shape:
        raise ValueError(f"{what} got an empty video of shape {tuple(array.shape)}; pass at least one frame")
    return np.ascontiguousarray(array)


def _check_fps(fps: Any, what: str) -> Fraction:
    """`fps` as a Fraction (the float 30000 / 1001 -> Fraction(30000, 1001)), or a ValueError."""
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"{what} fps must be a positive finite number of frames per second, got {fps!r}")
    # NTSC rates are n * 1000/1001: a denominator of at most 1001 recovers them from a float.
    return Fraction(fps).limit_denominator(1001)


def _check_sample_rate(sample_rate: Any, what: str, rates: Sequence[int] | None = None) -> int:
    """`sample_rate` as an int (one of `rates` when given), or a ValueError."""
    if sample_rate is None:
        raise ValueError(
            f"{what} got audio but no sample_rate; pass sample_rate=<samples per second> "
            f"(e.g. 24000) for the waveform"
        )
    integral = isinstance(sample_rate, numbers.Integral) and not isinstance(sample_rate, bool)
    if not integral or sample_rate <= 0:
        raise ValueError(
            f"{what} sample_rate must be a positive int (samples per second), got {sample_rate!r}"
        )
    if rates is not None and sample_rate not in rates:
        raise ValueError(
            f"{what} sample_rate must be one the AAC encoder takes, one of "
            f"{', '.join(map(str, rates))}, got {sample_rate!r}; resample the waveform first "
            f"(omni_rl.utils.audio.resample)"
        )
    return int(sample_rate)


def _waveform_array(audio: Any, what: str) -> np.ndarray:
    """`audio` as float32 [channels, samples] in [-1, 1], or a ValueError naming what is wrong."""
    if hasattr(audio, "detach"):
        # bfloat16 has no numpy dtype: go through float32.
        audio = audio.detach().cpu()
        audio = audio.float() if audio.is_floating_point() else audio
        audio = audio.numpy()
    array = np.asarray(audio)
    if not np.issubdtype(array.dtype, np.floating) or array.ndim not in (1, 2):
        raise ValueError(
            f"{what} expects a float waveform shaped [channels, samples] or [samples] in "
            f"[-1, 1], got dtype {array.dtype} shape {tuple(array.shape)}; convert int16 PCM "
            f"with x / 32768"
        )
    if array.ndim == 1:
        array = array[None]
    channels, samples = array.shape
    if channels not in (1, 2):
        hint = "; it looks like [samples, channels]: transpose it" if samples in (1, 2) else ""
        raise ValueError(
            f"{what} takes a mono or stereo waveform [channels, samples] with 1 or 2 channels, "
            f"got shape {tuple(array.shape)}{hint}"
        )
    if samples == 0:
        raise ValueError(f"{what} got an empty waveform (0 samples); pass at least one sample")
    if not np.isfinite(array).all():
        raise ValueError(f"{what} got a waveform with NaN or infinite samples; check the vocoder output")
    peak = float(np.abs(array).max())
    if peak > 1.0:
        raise ValueError(
            f"{what} expects waveform samples in [-1, 1], got a peak of {peak:.4g}; "
            f"clip it (x.clamp(-1, 1)) or normalise it (x / x.abs().max())"
        )
    return np.ascontiguousarray(array, dtype=np.float32)


def encode_mp4(frames: Any, fps: float, audio: Any = None, sample_rate: int | None = None) -> bytes:
    """The mp4 file `save_video` writes, as bytes (see there)."""
    array = _frames_array(frames, "save_video")
    rate = _check_fps(fps, "save_video")
    waveform = None
    if audio is not None:
        sample_rate = _check_sample_rate(sample_rate, "save_video", AAC_SAMPLE_RATES)
        waveform = _waveform_array(audio, "save_video")
    # yuv420p stores colour at half resolution, so H.264 needs even sizes: repeat the last
    # row / column rather than crop away a sample's edge.
    _, height, width, _ = array.shape
    if height % 2 or width % 2:
        array = np.pad(array, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")

    import av

    buffer = io.BytesIO()
    # In memory: ffmpeg writes the mp4 index (moov) after the media, seeking back, and a
    # failure half way must not leave a file behind. Browsers play moov-at-end files.
    with av.open(buffer, mode="w", format="mp4") as container:
        video = container.add_stream("libx264", rate=rate)
        video.width, video.height, video.pix_fmt = array.shape[2], array.shape[1], "yuv420p"
        video.options = {"crf": str(_CRF)}
        # Converted with the BT.709 matrix and tagged so: untagged, players guess (BT.601 for
        # small frames, BT.709 for HD) and shift the hues of one of the two.
        context = video.codec_context
        context.colorspace = context.color_primaries = context.color_trc = 1  # AVCOL_*_BT709
        context.color_range = 1  # AVCOL_RANGE_MPEG (limited, 16-235): what players expect
        if waveform is not None:
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = "mono" if waveform.shape[0] == 1 else "stereo"

        for index, image in enumerate(array):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(
                format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG"
            )
            frame.pts = index  # in the stream's time base, 1 / fps
            container.mux(video.encode(frame))
        container.mux(video.encode())
        if waveform is not None:
            # One frame with the whole clip: PyAV cuts it into the encoder's 1024-sample frames.
            chunk = av.AudioFrame.from_ndarray(waveform, format="fltp", layout=sound.layout.name)
            chunk.sample_rate, chunk.pts = sample_rate, 0
            container.mux(sound.encode(chunk))
            container.mux(sound.encode())
    return buffer.getvalue()


def save_video(
    frames: Any,
    path: str | os.PathLike,
    fps: float,
    audio: Any = None,
    sample_rate: int | None = None,
) -> Path:
    """Write uint8 frames [T, H, W, 3] as an H.264 mp4 at `fps`, atomically; returns the path.

    yuv420p in BT.709 at CRF 18 (odd sizes padded to even); with `audio` (float [channels, samples]
    or [samples], 1 or 2 channels) and `sample_rate`, an AAC track of its own length.
    """
    return atomic_write_bytes(path, encode_mp4(frames, fps, audio, sample_rate))


def gif_bytes(frames: Any, fps: float) -> bytes:
    """An animated GIF of uint8 frames [T, H, W, 3] at `fps` that loops forever.

    GIF delays are whole hundredths of a second, so the rate is rounded, and capped at 50 fps
    (browsers slow shorter delays); each frame gets its own 256-colour palette.
    """
    array = _frames_array(frames, "gif_bytes")
    rate = _check_fps(fps, "gif_bytes")
    delay_ms = max(_GIF_MIN_DELAY_MS, 10 * round(100 / rate))
    images = [Image.fromarray(image) for image in array]
    buffer = io.BytesIO()
    images[0].save(
        buffer, format="GIF", save_all=True, append_images=images[1:], duration=delay_ms, loop=0
    )
    return buffer.getvalue()


def _sheet_tiles(array: np.ndarray, num_frames: int) -> list[Image.Image]:
    """`num_frames` evenly spaced frames (all when fewer), first and last included."""
    count = min(num_frames, len(array))
    indices = np.linspace(0, len(array) - 1, count).round().astype(int)
    tiles = [Image.fromarray(array[index]) for index in indices]
    height, width = array.shape[1:3]
    if height > _SHEET_FRAME_HEIGHT:
        size = (max(1, round(width * _SHEET_FRAME_HEIGHT / height)), _SHEET_FRAME_HEIGHT)
        tiles = [tile.resize(size, Image.LANCZOS) for tile in tiles]
    return tiles


def contact_sheet(frames: Any, num_frames: int = 8, caption: str | None = None) -> Image.Image:
    """`num_frames` evenly spaced frames of a video side by side in one RGB image, captioned.

    Frames taller than 256 px are shrunk to 256 px; small ones are enlarged as in `make_grid`.
    """
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"contact_sheet num_frames must be an int >= 1, got {num_frames!r}")
    tiles = _sheet_tiles(_frames_array(frames, "contact_sheet"), num_frames)
    sheet = make_grid(tiles, nrow=len(tiles))
    if caption is None:
        return sheet
    # The sheet as one tile of a grid without padding: make_grid's caption strip, fitted to
    # the sheet's width.
    return make_grid([sheet], nrow=1, captions=[caption], padding=0, min_tile_size=0)


def video_grid(
    videos: Any,
    nrow: int = 1,
    captions: Sequence[str] | None = None,
    num_frames: int = 8,
) -> Image.Image:
    """One contact sheet per video, `nrow` to a row, each captioned: the picture of a validation step.

    `videos` is uint8 [B, T, H, W, 3] or a list of [T, H, W, 3] videos of one size.
    """
    if isinstance(videos, (list, tuple)):
        arrays = [_frames_array(video, "video_grid") for video in videos]
    else:
        array = videos.detach().cpu().numpy() if hasattr(videos, "detach") else np.asarray(videos)
        if array.ndim != 5:
            raise ValueError(
                f"video_grid expects uint8 videos shaped [B, T, H, W, 3] or a list of [T, H, W, 3], "
                f"got shape {tuple(array.shape)}; wrap a single video in a list: [video]"
            )
        arrays = [_frames_array(video, "video_grid") for video in array]
    if not arrays:
        raise ValueError("video_grid got no videos; pass at least one")
    shapes = sorted({(video.shape[1], video.shape[2], min(num_frames, len(video))) for video in arrays})
    if len(shapes) > 1:
        raise ValueError(
            f"video_grid needs videos of one size with at least num_frames={num_frames} frames "
            f"(or all of one length), got (height, width, frames shown) {shapes}; resize them "
            f"or lower num_frames"
        )
    if captions is not None and len(captions) != len(arrays):
        raise ValueError(
            f"got {len(captions)} captions for {len(arrays)} videos; pass one caption per video or None"
        )
    sheets = [contact_sheet(video, num_frames) for video in arrays]
    return make_grid(sheets, nrow=nrow, captions=captions, min_tile_size=0)
