"""`read_wav(data, where)`: integer-PCM WAV bytes -> (float32 mono samples in [-1, 1], rate).

Anything it cannot read whole raises `PromptFileError` naming `where` and the problem.
Left out on purpose: float and compressed WAV, other containers, resampling (`omni_rl.utils.audio`).
"""
from __future__ import annotations

import io
import wave

import numpy as np

from omni_rl.data.prompt_item import PromptFileError

__all__ = ["read_wav"]

_CONVERT = "only integer PCM WAV is read (convert with e.g. ffmpeg -i in -acodec pcm_s16le out.wav)"


def read_wav(data: bytes, where: str) -> tuple[np.ndarray, int]:
    """Integer-PCM WAV bytes -> (float32 mono samples in [-1, 1], sample_rate)."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            claimed = wav.getnframes()
            frames = wav.readframes(claimed)
    except EOFError:
        # `wave` raises a bare EOFError when a chunk header is cut off: say so.
        raise PromptFileError(
            f"{where}: not a readable WAV file (its {len(data)} bytes end inside the header: the file is truncated "
            f"or empty); {_CONVERT}"
        ) from None
    except wave.Error as err:
        raise PromptFileError(f"{where}: not a readable WAV file ({err or type(err).__name__}); {_CONVERT}") from None
    if rate <= 0:
        raise PromptFileError(f"{where}: the WAV header gives a sample rate of {rate} Hz; expected a positive rate "
                              f"(e.g. 16000); the header is damaged: re-export the file")
    if width not in (1, 2, 3, 4):
        raise PromptFileError(f"{where}: WAV sample width {width} bytes is not supported; expected 1..4")
    if len(frames) < claimed * channels * width:
        raise PromptFileError(
            f"{where}: the WAV data chunk claims {claimed * channels * width} bytes ({claimed / rate:.1f} s) but the "
            f"file holds {len(frames)} ({len(frames) // (channels * width) / rate:.2f} s): it is truncated, or its "
            f"writer never filled in the size; re-export the file whole"
        )
    if width == 1:
        samples = (np.frombuffer(frames, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)
        samples = value.astype(np.float32) / float(1 << 23)
    else:
        samples = (np.frombuffer(frames, dtype="<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    if samples.size == 0:
        raise PromptFileError(f"{where}: the WAV file holds no samples")
    samples = samples[: samples.size - samples.size % channels].reshape(-1, channels)
    return samples.mean(axis=1, dtype=np.float32), rate
