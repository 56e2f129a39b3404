"""rewards/clap.py: the band-limited resampler on sines, and CLAP on a tiny random model
saved with save_pretrained and loaded back by path."""
import math

import pytest
import torch

from omni_rl.reward import RewardInputError, build_reward
from rewards.clap import resample
from rewards.tiny_models import build_tiny_clap

PROMPTS = ["a dog barking", "rain on a roof", "x", "a very long prompt " * 40]


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


@pytest.fixture(scope="module")
def clap_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_clap")
    build_tiny_clap(folder, max_length_s=1)
    return str(folder)


def test_score_is_the_models_own_cosine_at_48k(clap_dir):
    from transformers import ClapModel, ClapProcessor

    audio = torch.randn(4, 48000, generator=torch.Generator().manual_seed(0)) * 0.1  # exactly one window
    scores = build_reward("clap", model=clap_dir, sample_rate=48000)(audio, PROMPTS, [{}] * 4)
    assert len(scores) == 4 and all(isinstance(s, float) and -1 <= s <= 1 for s in scores)
    model = ClapModel.from_pretrained(clap_dir).eval()
    processor = ClapProcessor.from_pretrained(clap_dir)
    text = processor.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
    features = processor.feature_extractor(list(audio.numpy()), sampling_rate=48000, return_tensors="pt")
    with torch.no_grad():
        out = model(**text, **features)
    assert scores == pytest.approx((out.text_embeds * out.audio_embeds).sum(-1).tolist(), abs=1e-5)


def test_batched_equals_one_at_a_time_with_mixed_rates_and_lengths(clap_dir):
    g = torch.Generator().manual_seed(1)
    clips = [torch.randn(8000, generator=g), torch.randn(33075, generator=g).numpy(),
             torch.randn(70000, generator=g), torch.randn(4000, generator=g)]
    metadata = [{"sample_rate": 16000}, {"sample_rate": 22050}, {}, {"sample_rate": 8000}]
    scorer = build_reward("clap", model=clap_dir, sample_rate=44100)  # the default for clip 2
    batched = scorer(clips, PROMPTS, metadata)
    single = [scorer(clips[i:i + 1], PROMPTS[i:i + 1], metadata[i:i + 1])[0] for i in range(4)]
    assert batched == pytest.approx(single, abs=1e-5)
    assert scorer(clips, PROMPTS, metadata) == batched  # no randomness in cropping


def test_a_long_clip_is_scored_on_its_first_window(clap_dir):
    scorer = build_reward("clap", model=clap_dir, sample_rate=48000)
    long = torch.randn(1, 150000, generator=torch.Generator().manual_seed(2))
    assert scorer(long, ["p"], [{}]) == pytest.approx(scorer(long[:, :48000], ["p"], [{}]), abs=1e-6)


def test_audio_input_errors_say_what_to_do(clap_dir):
    scorer = build_reward("clap", model=clap_dir)
    with pytest.raises(RewardInputError, match=r"audio\[1\] has no sample rate.*metadata\[1\]\['sample_rate'\]"):
        scorer([torch.zeros(100), torch.zeros(100)], ["a", "b"], [{"sample_rate": 16000}, {}])
    with pytest.raises(RewardInputError, match=r"mix down first: audio.mean\(dim=1\)"):
        scorer(torch.zeros(2, 2, 100), ["a", "b"], [{}, {}])
    with pytest.raises(RewardInputError, match="int16 PCM: divide by 32768"):
        scorer([torch.zeros(100, dtype=torch.int16)], ["a"], [{"sample_rate": 16000}])
    with pytest.raises(RewardInputError, match="got 2 samples but 1 prompts"):
        scorer(torch.zeros(2, 100), ["a"], [{}, {}])
    with pytest.raises(ValueError, match="sample_rate=-5"):
        build_reward("clap", model=clap_dir, sample_rate=-5)
