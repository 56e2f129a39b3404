"""rewards/speaker_similarity.py: cosine similarity of WavLM x-vectors with a reference voice, on a
tiny random `WavLMForXVector` saved with save_pretrained and loaded back by path (the reference
voice is a WAV file the tests write)."""
import math
import wave

import pytest
import torch

from omni_rl.errors import OmniConfigError
from omni_rl.reward import MediaSamples, RewardConfigError, build_reward
from rewards.speaker_similarity import min_input_samples
from rewards.tiny_models import build_tiny_wavlm_sv

RATE = 16000


def write_wav(path, clip: torch.Tensor, rate: int, channels: int = 1) -> None:
    pcm = (clip.clamp(-1, 1) * 32767).round().to(torch.int16)
    frames = pcm[:, None].expand(-1, channels).reshape(-1) if channels > 1 else pcm
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames.numpy().astype("<i2").tobytes())


def tone(freq: float, seconds: float, rate: int = RATE) -> torch.Tensor:
    t = torch.arange(int(seconds * rate)) / rate
    return 0.5 * torch.cos(2 * math.pi * freq * t)


@pytest.fixture(scope="module")
def wavlm_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_wavlm")
    build_tiny_wavlm_sv(folder)
    return str(folder)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference "voice": a 250 Hz tone, 1 s, 16-bit stereo WAV at 22.05 kHz."""
    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    write_wav(path, tone(250, 1.0, 22050), 22050, channels=2)
    return str(path)


@pytest.fixture(scope="module")
def scorer(wavlm_dir, reference):
    return build_reward("speaker_similarity", reference_audio=reference, model=wavlm_dir)


def test_the_reference_scores_one_and_other_audio_less(scorer):
    noise = 0.3 * torch.randn(RATE, generator=torch.Generator().manual_seed(0))
    clips = [tone(250, 1.0), tone(1000, 1.0), torch.zeros(RATE), noise]
    scores = scorer(MediaSamples(audio=clips, sample_rate=RATE), ["p"] * 4, [{}] * 4)
    assert all(isinstance(s, float) and -1.0 <= s <= 1.0 for s in scores)
    # The reference's own tone (at 16 kHz here, 22.05 kHz in the file; 16-bit rounding) is ~1.
    assert scores[0] > 0.999
    assert max(scores[1:]) < 0.99


def test_the_reference_file_itself_scores_one(scorer, reference):
    with wave.open(reference, "rb") as file:
        pcm = torch.frombuffer(bytearray(file.readframes(file.getnframes())), dtype=torch.int16)
    clip = pcm.view(-1, 2).float().mean(dim=1) / 32768.0
    assert scorer([clip], ["p"], [{"sample_rate": 22050}]) == pytest.approx([1.0], abs=1e-5)


def test_a_sample_scores_the_same_in_any_batch(scorer):
    clips = [tone(250, 1.0), tone(700, 0.6), torch.zeros(RATE // 4)]
    batched = scorer(MediaSamples(audio=clips, sample_rate=RATE), ["p"] * 3, [{}] * 3)
    single = [scorer([c], ["p"], [{"sample_rate": RATE}])[0] for c in clips]
    assert batched == pytest.approx(single, abs=1e-6)


def test_a_clip_shorter_than_the_model_is_padded(scorer, wavlm_dir):
    from transformers import WavLMConfig

    # wavlm-base-plus-sv's TDNN and 7 convolutions: 2 + 4 + 4 + 6 = 16 frames of 320 samples + 80.
    assert min_input_samples(WavLMConfig(tdnn_kernel=(5, 3, 3, 1, 1), tdnn_dilation=(1, 2, 3, 1, 1))) == 5200
    short = tone(250, 0.01)  # 160 samples
    padded = torch.nn.functional.pad(short, (0, min_input_samples(scorer.model.config) - 160))
    score = scorer([short], ["p"], [{"sample_rate": RATE}])
    assert math.isfinite(score[0]) and score == pytest.approx(scorer([padded], ["p"], [{"sample_rate": RATE}]), abs=1e-6)


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "missing.wav", "missing.wav': no such file; expected a WAV file (integer PCM) of the voice"),
    (lambda d: d, "is a folder; expected a WAV file"),
    (lambda d: (d / "notes.wav").write_text("not audio") and d / "notes.wav", "notes.wav': not a readable WAV file"),
])
def test_a_reference_that_is_missing_or_not_audio_is_one_line_at_load(tmp_path, make, expected):
    path = make(tmp_path)
    with pytest.raises(RewardConfigError, match=r"reward 'speaker_similarity': reference_audio=") as info:
        build_reward("speaker_similarity", reference_audio=str(path), model="never/loaded")
    assert expected in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(OmniConfigError):  # what the command line prints as one `error:` line
        build_reward("speaker_similarity", reference_audio=str(path), model="never/loaded")
