"""rewards/video_stats.py: temporal_smoothness, video_brightness, audio_loudness on hand-made
samples whose scores are worked out in the comments."""
import math

import pytest
import torch

from omni_rl.reward import MediaSamples, RewardInputError, build_reward


def _score(name, media, n=None):
    n = len(media) if n is None else n
    return build_reward(name)(media, ["p"] * n, [{}] * n)


def _video(frames):
    """[B][T] grey levels -> uint8 [B, T, 2, 2, 3] with every pixel of frame t of sample b that level."""
    return torch.tensor(frames, dtype=torch.uint8).view(len(frames), len(frames[0]), 1, 1, 1).expand(-1, -1, 2, 2, 3)


def test_temporal_smoothness():
    video = _video([
        [100, 100, 100],  # still: 1
        [0, 255, 0],      # every pixel jumps 255 twice: 1 - 255/255 = 0
        [0, 51, 153],     # |51 - 0| = 51, |153 - 51| = 102: 1 - (51 + 102) / 2 / 255 = 1 - 0.3 = 0.7
    ])
    assert _score("temporal_smoothness", MediaSamples(video=video, fps=8)) == pytest.approx([1.0, 0.0, 0.7])


def test_temporal_smoothness_averages_over_pixels_and_one_frame_is_smooth():
    video = torch.zeros(1, 2, 1, 2, 3, dtype=torch.uint8)
    video[0, 1, 0, 0] = 255  # one of the two pixels changes fully between the two frames: 1 - 0.5
    assert _score("temporal_smoothness", MediaSamples(video=video, fps=8)) == pytest.approx([0.5])
    still = MediaSamples(video=torch.randint(0, 256, (2, 1, 3, 3, 3), dtype=torch.uint8), fps=8)
    assert _score("temporal_smoothness", still) == [1.0, 1.0]


def test_video_brightness():
    video = _video([
        [0, 0, 0, 0],          # 0
        [255, 255, 255, 255],  # 1
        [0, 51, 102, 153],     # (0 + 51 + 102 + 153) / 4 / 255 = 76.5 / 255 = 0.3
    ])
    assert _score("video_brightness", MediaSamples(video=video, fps=8)) == pytest.approx([0.0, 1.0, 0.3])
    rgb = torch.zeros(1, 1, 1, 1, 3, dtype=torch.uint8)
    rgb[..., 0] = 255  # pure red: the plain mean over channels, 255 / 3 / 255 = 1/3
    assert _score("video_brightness", MediaSamples(video=rgb, fps=8)) == pytest.approx([1 / 3])


def test_audio_loudness():
    square = torch.tensor([1.0, -1.0] * 50)                                 # RMS 1
    sine = 0.5 * torch.sin(torch.arange(800) * (2 * math.pi / 80))          # 10 whole periods: 0.5 / sqrt(2)
    half = torch.tensor([[0.6, -0.6, 0.6, -0.6], [0.0, 0.0, 0.0, 0.0]])     # stereo: sqrt(0.36 / 2) = 0.4243
    media = MediaSamples(audio=[square, sine, half], sample_rate=8000)
    assert _score("audio_loudness", media) == pytest.approx([1.0, 0.5 / math.sqrt(2), math.sqrt(0.18)], abs=1e-6)
    silence = MediaSamples(audio=torch.zeros(2, 2, 16), sample_rate=8000)
    assert _score("audio_loudness", silence) == [0.0, 0.0]


def test_they_need_their_stream():
    with pytest.raises(RewardInputError, match=r"temporal_smoothness: scores video, but got a Tensor"):
        _score("temporal_smoothness", torch.zeros(2, 4, 4, 3, dtype=torch.uint8), n=2)
    with pytest.raises(RewardInputError, match=r"audio_loudness: scores audio, but got a MediaSamples without audio"):
        _score("audio_loudness", MediaSamples(video=_video([[0]]), fps=8))
    with pytest.raises(RewardInputError, match="got 1 samples but 2 prompts"):
        build_reward("video_brightness")(MediaSamples(video=_video([[0]]), fps=8), ["a", "b"], [{}, {}])
