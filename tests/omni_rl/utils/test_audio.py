"""omni_rl/utils/audio.py: both resampling methods on sines (the sinc tests moved unchanged from
tests/rewards/test_clap_reward.py), and the FFT method against Qwen3-Omni's own copy."""
import math

import numpy as np
import pytest
import torch

from omni_rl.utils.audio import resample


def _sine(freq, rate, seconds=1.0):
    # float64 phase: a float32 sin(2 pi f t) is itself noisy at -60 dB for t ~ 1 s, f ~ 20 kHz.
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate
    return torch.sin(2 * math.pi * freq * t).float()


def _rms(x):
    return x.double().pow(2).mean().sqrt().item()


def _peak_hz(x, rate):
    spectrum = torch.fft.rfft(x.double() * torch.hann_window(len(x), dtype=torch.float64)).abs()
    return spectrum.argmax().item() * rate / len(x)


@pytest.mark.parametrize("orig, new, freq", [
    (16000, 48000, 1000), (44100, 48000, 3000), (48000, 16000, 2500), (22050, 16000, 440),
])
def test_resampled_sine_keeps_frequency_and_amplitude(orig, new, freq):
    y = resample(_sine(freq, orig), orig, new)
    assert y.shape == (new,)  # one second in, one second out: ceil(L * new / orig)
    edge = new // 20  # the signal is zero outside the clip, so the ends ring; judge the middle
    middle = y[edge:-edge]
    assert _peak_hz(middle, new) == pytest.approx(freq, abs=new / len(middle))
    assert _rms(middle) == pytest.approx(1 / math.sqrt(2), rel=1e-3)
    assert (middle - _sine(freq, new)[edge:-edge]).abs().max() < 5e-3  # the exact sine at the new rate


def test_downsampling_removes_what_the_new_rate_cannot_hold():
    # 12 kHz and 20 kHz are above the 8 kHz Nyquist of 16 kHz: a band-limited resampler drops
    # them (> 80 dB down); naive decimation or interpolation would alias them to 4 kHz.
    for freq in (12000, 20000):
        y = resample(_sine(freq, 48000), 48000, 16000)[1000:-1000]
        assert _rms(y) < 1e-4 * _rms(_sine(freq, 48000))
        aliased = _sine(freq, 48000)[::3][1000:-1000]
        assert _rms(aliased) > 0.5


def test_resample_shapes_and_identity():
    x = torch.randn(2, 3, 100)
    assert resample(x, 8000, 8000) is x
    assert resample(x, 8000, 12000).shape == (2, 3, 150)
    assert resample(x[0, 0, :7], 3, 2).shape == (5,)  # ceil(7 * 2 / 3)
    with pytest.raises(ValueError, match="orig_sr=0"):
        resample(x, 0, 16000)


@pytest.mark.parametrize("orig, new", [(8000, 16000), (16000, 8000), (44100, 48000), (48000, 16000)])
def test_fft_method_keeps_a_periodic_sine_exactly(orig, new):
    # 100 whole periods in the clip: the FFT's periodic extension is the sine itself, so the
    # resampled clip is the sine at the new rate everywhere, ends included (unlike "sinc").
    y = resample(_sine(100.0, orig), orig, new, method="fft")
    assert y.shape == (new,) and y.dtype == torch.float32
    assert (y - _sine(100.0, new)).abs().max() < 1e-4


def test_fft_method_lengths_round_and_identity():
    x = torch.randn(2, 3, 100)
    assert resample(x, 8000, 8000, method="fft") is x
    assert resample(x, 8000, 12000, method="fft").shape == (2, 3, 150)
    assert resample(x[0, 0, :7], 3, 2, method="fft").shape == (5,)  # round(4.67); "sinc" takes the ceil
    assert resample(x[0, 0, :5], 3, 2, method="fft").shape == (3,)  # round(3.33); "sinc" gives 4
    assert resample(x[0, 0, :5], 3, 2).shape == (4,)
    assert resample(x[0, 0, :1], 48000, 16000, method="fft").shape == (1,)  # never empty
    with pytest.raises(ValueError, match="method='linear'"):
        resample(x, 8000, 16000, method="linear")


def test_fft_method_is_qwen3_omnis_resampler_bit_for_bit():
    # adapters/qwen3_omni.py resamples its audio input with its own copy of this method: the
    # core's must give the very same float32 samples, so the adapter can call it instead.
    from adapters.qwen3_omni import resample_audio

    rng = np.random.default_rng(0)
    for n, orig, new in [(101, 8000, 16000), (100, 16000, 8000), (99, 48000, 16000), (1, 48000, 16000)]:
        samples = rng.standard_normal(n).astype(np.float32)
        ours = resample(torch.from_numpy(samples), orig, new, method="fft").numpy()
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, resample_audio(samples, orig, new))


def test_the_two_methods_differ_at_the_edges():
    # Why both are kept: the same clip resampled two ways differs where "sinc" sees zeros
    # beyond the clip and "fft" sees its other end.
    x = _sine(123.0, 8000, seconds=0.05)
    sinc, fft = resample(x, 8000, 16000), resample(x, 8000, 16000, method="fft")
    assert sinc.shape == fft.shape
    assert (sinc - fft)[:8].abs().max() > 1e-2
