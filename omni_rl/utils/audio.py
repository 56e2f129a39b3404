"""Band-limited audio resampling, in the core so that rewards and adapters both may import it.

`resample(waveform, orig_sr, new_sr, method=...)`: `"sinc"` (windowed-sinc polyphase) or `"fft"`
(as `scipy.signal.resample`); each caller names the one its numbers were made with. `wav_bytes`
writes a mono 16-bit PCM WAV. Left out: channel mixing.
"""
from __future__ import annotations

import functools
import math
import numbers

import torch

METHODS = ("sinc", "fft")


@functools.lru_cache(maxsize=16)
def _sinc_kernel(up: int, down: int, zero_crossings: int, rolloff: float, beta: float) -> tuple[torch.Tensor, int]:
    """Polyphase windowed-sinc kernel [up, 1, K] and the left padding it expects.

    Times are in input samples. Output sample j = n * up + p sits at t = n * down + p * down / up
    and is sum_k x[k] h(t - k), with the ideal low-pass h(tau) = 2 fc sinc(2 fc tau) cut at
    fc = rolloff * min(1, up / down) / 2 cycles per input sample (just below the lower of the
    two Nyquist frequencies), truncated to `zero_crossings` zero crossings each side
    (|tau| <= W = zero_crossings / (2 fc)) and tapered by a Kaiser window. Phase p reads the
    input at k = n * down + m for m in [m_lo, m_hi], one strided convolution for all phases.
    """
    fc = 0.5 * rolloff * min(1.0, up / down)
    half_width = zero_crossings / (2.0 * fc)
    m_lo = -math.ceil(half_width)
    m_hi = math.floor((up - 1) * down / up + half_width)
    m = torch.arange(m_lo, m_hi + 1, dtype=torch.float64)
    phase = torch.arange(up, dtype=torch.float64)[:, None] * down / up
    tau = phase - m[None, :]  # [up, K]: distance from each output time to each tap
    inside = tau.abs() <= half_width
    ratio = (tau / half_width).clamp(-1.0, 1.0)
    i0_beta = torch.special.i0(torch.tensor(beta, dtype=torch.float64))
    window = torch.special.i0(beta * torch.sqrt(1.0 - ratio**2)) / i0_beta
    kernel = 2.0 * fc * torch.sinc(2.0 * fc * tau) * window * inside
    return kernel[:, None, :], -m_lo


def _resample_sinc(
    waveform: torch.Tensor, orig_sr: int, new_sr: int, zero_crossings: int, rolloff: float, beta: float,
) -> torch.Tensor:
    g = math.gcd(orig_sr, new_sr)
    up, down = new_sr // g, orig_sr // g
    kernel, left = _sinc_kernel(up, down, zero_crossings, rolloff, beta)
    kernel = kernel.to(device=waveform.device, dtype=waveform.dtype)
    shape = waveform.shape
    x = waveform.reshape(-1, 1, shape[-1])
    length = shape[-1]
    out_length = math.ceil(length * up / down)
    n_frames = math.ceil(out_length / up)
    right = max(0, (n_frames - 1) * down + kernel.shape[-1] - (length + left))
    x = torch.nn.functional.pad(x, (left, right))
    y = torch.nn.functional.conv1d(x, kernel, stride=down)[..., :n_frames]  # [N, up, n_frames]
    y = y.transpose(1, 2).reshape(x.shape[0], -1)[:, :out_length]
    return y.reshape(*shape[:-1], out_length)


def _resample_fft(waveform: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    x = waveform.to(torch.float64)
    n = x.shape[-1]
    m = max(1, round(n * new_sr / orig_sr))
    spectrum = torch.fft.rfft(x)
    out = torch.zeros(*x.shape[:-1], m // 2 + 1, dtype=spectrum.dtype, device=spectrum.device)
    keep = min(spectrum.shape[-1], out.shape[-1])
    out[..., :keep] = spectrum[..., :keep]
    # irfft normalises by the new length m, rfft's spectrum is of length n: m / n keeps amplitudes.
    return (torch.fft.irfft(out, n=m) * (m / n)).to(waveform.dtype)


def resample(
    waveform: torch.Tensor, orig_sr: int, new_sr: int, *, method: str = "sinc",
    zero_crossings: int = 32, rolloff: float = 0.92, beta: float = 8.6,
) -> torch.Tensor:
    """Band-limited resampling of `waveform` [..., L] from `orig_sr` to `new_sr` Hz.

    `method` is `"sinc"` or `"fft"` (their lengths and edges differ).
    `zero_crossings`, `rolloff` and `beta` shape the sinc kernel and are ignored by `"fft"`.
    """
    for name, rate in (("orig_sr", orig_sr), ("new_sr", new_sr)):
        if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
            raise ValueError(f"resample: {name}={rate!r}; expected a positive integer number of Hz")
    if method not in METHODS:
        raise ValueError(f"resample: method={method!r}; expected one of {list(METHODS)}")
    if orig_sr == new_sr:
        return waveform
    if method == "fft":
        return _resample_fft(waveform, int(orig_sr), int(new_sr))
    return _resample_sinc(waveform, int(orig_sr), int(new_sr), zero_crossings, rolloff, beta)


def wav_bytes(waveform: torch.Tensor, sample_rate: int) -> bytes:
    """A mono float waveform [S] (values in [-1, 1]; clipped there) as a 16-bit PCM WAV file's bytes
    (the standard `wave` module's format, which any player and `wave.open` read back)."""
    import io
    import wave

    if waveform.dim() != 1:
        raise ValueError(f"wav_bytes: waveform of shape {tuple(waveform.shape)}; expected a mono [S] waveform")
    pcm = (waveform.detach().float().cpu().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(int(sample_rate))
        wav.writeframes(pcm.numpy().astype("<i2").tobytes())
    return out.getvalue()
