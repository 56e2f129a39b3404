"""rewards/clap.py: CLAP on a tiny random model saved with save_pretrained and loaded back by
path (the resampler it uses is tested in tests/omni_rl/utils/test_audio.py)."""
import pytest
import torch

from omni_rl.reward import RewardInputError, build_reward
from omni_rl.reward.media import MediaSamples
from rewards.tiny_models import build_tiny_clap

PROMPTS = ["a dog barking", "rain on a roof", "x", "a very long prompt " * 40]


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


def test_media_samples_are_scored_at_their_sample_rate(clap_dir):
    g = torch.Generator().manual_seed(3)
    audio = torch.randn(4, 16000, generator=g) * 0.1
    scorer = build_reward("clap", model=clap_dir)
    expected = scorer(audio, PROMPTS, [{"sample_rate": 16000}] * 4)
    media = MediaSamples(video=torch.zeros(4, 2, 8, 8, 3, dtype=torch.uint8), fps=8, audio=audio, sample_rate=16000)
    assert scorer(media, PROMPTS, [{"sample_rate": 48000}] * 4) == pytest.approx(expected, abs=1e-6)
    # Clips of different lengths, one of them stereo (mixed down: both channels equal here).
    clips = [audio[0], torch.stack([audio[1][:9000], audio[1][:9000]]), audio[2][:4000], audio[3]]
    ragged = scorer(MediaSamples(audio=clips, sample_rate=16000), PROMPTS, [{}] * 4)
    mono = [audio[0], audio[1][:9000], audio[2][:4000], audio[3]]
    assert ragged == pytest.approx(scorer(mono, PROMPTS, [{"sample_rate": 16000}] * 4), abs=1e-6)


def test_media_samples_without_audio_and_through_the_manager(clap_dir):
    from omni_rl.reward import RewardManager, RewardSpec

    scorer = build_reward("clap", model=clap_dir)
    video_only = MediaSamples(video=torch.zeros(1, 2, 8, 8, 3, dtype=torch.uint8), fps=8)
    with pytest.raises(RewardInputError, match="clap: the MediaSamples hold no audio"):
        scorer(video_only, ["a"], [{}])
    media = MediaSamples(audio=torch.randn(2, 8000, generator=torch.Generator().manual_seed(4)), sample_rate=8000)
    manager = RewardManager([RewardSpec("clap", kwargs={"model": clap_dir})])
    assert manager.score(media, PROMPTS[:2]).total.tolist() == pytest.approx(scorer(media, PROMPTS[:2], [{}] * 2), abs=1e-6)
