"""omni_rl/reward/media.py (MediaSamples) and what the RewardManager hands each reward of one:
the container's checks, frame sampling, declared modalities, and an image reward averaged over
the frames of a video (`video_frames`)."""
import pytest
import torch

import rewards  # noqa: F401  (registers brightness, video_brightness, audio_loudness)
from omni_rl.reward import (
    MediaSamples,
    RewardConfigError,
    RewardInputError,
    RewardManager,
    RewardSpec,
    frame_indices,
    register_reward,
    reward_modalities,
)
from omni_rl.reward.registry import DEFAULT_MODALITIES


def _video(b=2, t=5, h=2, w=3, c=3):
    return torch.zeros(b, t, h, w, c, dtype=torch.uint8)


# Records what the manager handed it; scores sample i as the first pixel of image i / 255.
SEEN = {}


@register_reward("tests.media.first_pixel")
def first_pixel():
    def score(images, prompts, metadata):
        SEEN.update(images=images, prompts=list(prompts), metadata=list(metadata))
        return (images[:, 0, 0, 0].double() / 255).tolist()
    return score


@register_reward("tests.media.echo_media", modalities={"video", "audio"})
def echo_media():
    def score(samples, prompts, metadata):
        SEEN.update(media=samples)
        return [0.5] * len(samples)
    return score


@register_reward("tests.media.by_option", modalities=lambda *, stream="video": {stream})
def by_option(*, stream="video"):
    return lambda samples, prompts, metadata: [0.0] * len(samples)


# --- the container ---------------------------------------------------------------------------
def test_video_audio_and_both():
    v = MediaSamples(video=_video(), fps=16)
    assert len(v) == 2 and v.fps == 16.0 and isinstance(v.fps, float) and v.modalities == {"video"}
    a = MediaSamples(audio=torch.zeros(3, 2, 100), sample_rate=48000)
    assert len(a) == 3 and a.modalities == {"audio"}
    both = MediaSamples(video=_video(b=2), fps=24.0, audio=[torch.zeros(10), torch.zeros(2, 7)], sample_rate=16000)
    assert len(both) == 2 and both.modalities == {"video", "audio"}


@pytest.mark.parametrize("kwargs, match", [
    ({}, "neither video nor audio"),
    ({"video": _video().float(), "fps": 8}, r"MediaSamples.video has dtype torch.float32; expected uint8"),
    ({"video": _video()[0], "fps": 8}, r"video has shape \(5, 2, 3, 3\); expected 5 dims .*video\[None\]"),
    ({"video": _video(h=3, w=8, c=8), "fps": 8}, r"channels first\? use video.permute\(0, 1, 3, 4, 2\)"),
    ({"video": _video(t=0), "fps": 8}, r"expected B, T, H, W >= 1"),
    ({"video": _video().numpy(), "fps": 8}, "has type ndarray; expected a torch.uint8 tensor"),
    ({"video": _video()}, r"MediaSamples.fps=None; expected the video's frames per second"),
    ({"video": _video(), "fps": 0}, r"MediaSamples.fps=0; expected .* > 0"),
    ({"video": _video(), "fps": float("nan")}, r"MediaSamples.fps=nan"),
    ({"fps": 8, "audio": torch.zeros(2, 5), "sample_rate": 8}, r"MediaSamples.fps=8 but video is None"),
    ({"audio": torch.zeros(2, 5)}, r"MediaSamples.sample_rate=None; expected the audio's rate in Hz"),
    ({"audio": torch.zeros(2, 5), "sample_rate": 16000.0}, r"sample_rate=16000.0; expected .* an int > 0"),
    ({"video": _video(), "fps": 8, "sample_rate": 16000}, r"sample_rate=16000 but audio is None"),
    ({"audio": torch.zeros(2, 5, dtype=torch.int16), "sample_rate": 8}, r"dtype torch.int16; .*divide by 32768"),
    ({"audio": torch.zeros(5), "sample_rate": 8}, r"audio has shape \(5,\); expected \[B, S\] or \[B, C, S\].*audio\[None\]"),
    ({"audio": [torch.zeros(5), torch.zeros(1, 2, 3)], "sample_rate": 8}, r"audio\[1\] has shape \(1, 2, 3\)"),
    ({"audio": [torch.zeros(5), [0.0]], "sample_rate": 8}, r"audio\[1\] has type list"),
    ({"audio": [], "sample_rate": 8}, "audio is an empty list"),
    ({"audio": torch.tensor([[0.0, float("inf")]]), "sample_rate": 8}, "contains NaN or inf"),
    ({"video": _video(b=2), "fps": 8, "audio": torch.zeros(3, 5), "sample_rate": 8},
     "video has 2 samples but audio has 3"),
])
def test_bad_fields_are_named_with_what_is_expected(kwargs, match):
    with pytest.raises(RewardInputError, match=match):
        MediaSamples(**kwargs)


# --- frames and mono -------------------------------------------------------------------------
@pytest.mark.parametrize("t, k, expected", [
    (5, 3, [0, 2, 4]),        # i * 4 / 2
    (10, 4, [0, 3, 6, 9]),    # i * 9 / 3
    (8, 3, [0, 4, 7]),        # 3.5 rounds up to 4
    (5, 2, [0, 4]),
    (7, 1, [0]),
    (1, 3, [0, 0, 0]),
    (2, 4, [0, 0, 1, 1]),     # 1/3 -> 0, 2/3 -> 1: both frames count twice
])
def test_frame_indices_are_evenly_spaced_with_first_and_last(t, k, expected):
    assert frame_indices(t, k) == expected


def test_frames_are_sample_major():
    video = torch.arange(2 * 5, dtype=torch.uint8).view(2, 5, 1, 1, 1).expand(2, 5, 2, 3, 3).contiguous()
    frames = MediaSamples(video=video, fps=8).frames(3)  # frame t of sample b has every pixel 5 b + t
    assert frames.shape == (6, 2, 3, 3) and frames.dtype == torch.uint8
    assert frames[:, 0, 0, 0].tolist() == [0, 2, 4, 5, 7, 9]
    with pytest.raises(RewardInputError, match="k=0; expected an int >= 1"):
        MediaSamples(video=video, fps=8).frames(0)
    with pytest.raises(RewardInputError, match="no video"):
        MediaSamples(audio=torch.zeros(1, 3), sample_rate=8).frames(2)


def test_mono_averages_channels():
    stereo = torch.tensor([[[1.0, 0.0], [0.0, -1.0]]], dtype=torch.float64)  # one clip, 2 channels
    assert MediaSamples(audio=stereo, sample_rate=8).mono()[0].tolist() == [0.5, -0.5]
    clips = MediaSamples(audio=[torch.ones(3), torch.ones(2, 4)], sample_rate=8).mono()
    assert [c.shape for c in clips] == [(3,), (4,)] and all(c.dtype == torch.float32 for c in clips)


# --- declared modalities ---------------------------------------------------------------------
def test_declared_modalities():
    assert reward_modalities("brightness") == DEFAULT_MODALITIES == {"image", "text"}
    assert reward_modalities("clap") == {"audio"}
    assert reward_modalities("video_brightness") == {"video"}
    assert reward_modalities("tests.media.by_option", {"stream": "audio"}) == {"audio"}
    assert reward_modalities("imagebind", {"mode": "text_audio"}) == {"audio"}
    assert reward_modalities("imagebind", {}) == {"video"}  # text_video, the default
    assert reward_modalities("imagebind", {"mode": "all"}) == {"audio", "video"}
    with pytest.raises(RewardConfigError, match="mode='vid'"):
        reward_modalities("imagebind", {"mode": "vid"})
    with pytest.raises(RewardConfigError, match=r"modalities=\['smell'\]; expected a non-empty subset"):
        reward_modalities("tests.media.by_option", {"stream": "smell"})
    with pytest.raises(RewardConfigError, match="is a string"):
        register_reward("tests.media.never", modalities="video")


# --- the manager -----------------------------------------------------------------------------
def test_an_image_reward_is_averaged_over_k_frames():
    # Sample 0's frames are grey 0, 51, 102, 153, 204; sample 1's all white. k = 3 picks frames
    # 0, 2, 4. brightness (luma of grey v is v / 255): sample 0 (0 + 0.4 + 0.8) / 3 = 0.4,
    # sample 1 1.0. video_brightness is the mean over all 5 frames: (0+51+102+153+204)/5/255 = 0.4.
    video = torch.empty(2, 5, 2, 2, 3, dtype=torch.uint8)
    video[0] = torch.tensor([0, 51, 102, 153, 204], dtype=torch.uint8).view(5, 1, 1, 1)
    video[1] = 255
    manager = RewardManager([
        RewardSpec("brightness", weight=1.0, video_frames=3),
        RewardSpec("video_brightness", weight=0.5),
        {"name": "tests.media.first_pixel", "weight": 0.0, "video_frames": 3},
    ])
    out = manager.score(MediaSamples(video=video, fps=16), ["a", "b"], [{"i": 0}, {"i": 1}])
    assert out.per_reward["brightness"].tolist() == pytest.approx([0.4, 1.0])
    assert out.per_reward["video_brightness"].tolist() == pytest.approx([0.4, 1.0])
    assert out.total.tolist() == pytest.approx([0.4 + 0.5 * 0.4, 1.0 + 0.5 * 1.0])
    assert out.per_reward["tests.media.first_pixel"].tolist() == pytest.approx([0.4, 1.0])
    # The image reward saw 6 images, each prompt and metadata dict repeated once per frame.
    assert SEEN["images"].shape == (6, 2, 2, 3)
    assert SEEN["images"][:, 0, 0, 0].tolist() == [0, 102, 204, 255, 255, 255]
    assert SEEN["prompts"] == ["a", "a", "a", "b", "b", "b"]
    assert SEEN["metadata"] == [{"i": 0}] * 3 + [{"i": 1}] * 3


def test_a_media_reward_gets_the_media_samples():
    media = MediaSamples(video=_video(), fps=8, audio=torch.zeros(2, 10), sample_rate=8000)
    out = RewardManager([RewardSpec("tests.media.echo_media")]).score(media, ["a", "b"])
    assert SEEN["media"] is media and out.total.tolist() == [0.5, 0.5]


def test_an_image_reward_handed_video_says_to_set_video_frames():
    manager = RewardManager([RewardSpec("video_brightness"), RewardSpec("brightness", required=False)])
    with pytest.raises(RewardInputError, match=r"reward 'brightness' scores images, but the samples are video; "
                                               r"set reward.rewards\[1\].video_frames"):
        manager.score(MediaSamples(video=_video(), fps=8), ["a", "b"])


def test_a_reward_whose_streams_are_missing_fails_before_any_reward_runs():
    audio_only = MediaSamples(audio=torch.zeros(2, 10), sample_rate=8000)
    with pytest.raises(RewardInputError, match=r"'video_brightness' scores video, but the samples hold only audio"):
        RewardManager([RewardSpec("audio_loudness"), RewardSpec("video_brightness")]).score(audio_only, ["a", "b"])
    with pytest.raises(RewardInputError, match=r"'brightness' scores image and text, but the samples hold only audio"):
        RewardManager([RewardSpec("brightness", video_frames=2)]).score(audio_only, ["a", "b"])
    with pytest.raises(RewardInputError, match="got 2 samples but 1 prompts"):
        RewardManager([RewardSpec("audio_loudness")]).score(audio_only, ["a"])


def test_video_frames_is_checked_when_the_manager_is_built():
    with pytest.raises(RewardConfigError, match="video_frames=0; expected an int >= 1"):
        RewardSpec("brightness", video_frames=0)
    with pytest.raises(RewardConfigError, match="video_frames=True"):
        RewardSpec("brightness", video_frames=True)
    with pytest.raises(RewardConfigError, match="'video_brightness': video_frames=4 but the reward scores video itself"):
        RewardManager([RewardSpec("video_brightness", video_frames=4)])
    with pytest.raises(RewardConfigError, match="'audio_loudness': video_frames=4 but the reward scores audio, not images"):
        RewardManager([RewardSpec("audio_loudness", video_frames=4)])


def test_images_still_score_as_before_with_video_frames_set():
    images = torch.full((2, 2, 2, 3), 255, dtype=torch.uint8)
    out = RewardManager([RewardSpec("brightness", video_frames=4)]).score(images, ["a", "b"])
    assert out.total.tolist() == [1.0, 1.0]


# --- split / cat, and micro-batches of samples submitted one by one ---------------------------
def test_split_and_cat_round_trip():
    g = torch.Generator().manual_seed(0)
    video = torch.randint(0, 256, (3, 4, 2, 2, 3), dtype=torch.uint8, generator=g)
    media = MediaSamples(video=video, fps=12, audio=torch.randn(3, 2, 50, generator=g), sample_rate=8000)
    parts = media.split()
    assert [len(p) for p in parts] == [1, 1, 1]
    joined = MediaSamples.cat(parts)
    assert torch.equal(joined.video, video) and torch.equal(joined.audio, media.audio)
    assert (joined.fps, joined.sample_rate) == (12.0, 8000)
    ragged = MediaSamples.cat([MediaSamples(audio=torch.zeros(1, 5), sample_rate=8),
                               MediaSamples(audio=[torch.zeros(7)], sample_rate=8)])
    assert isinstance(ragged.audio, list) and [c.shape for c in ragged.audio] == [(5,), (7,)]
    with pytest.raises(RewardInputError, match=r"part 1 has streams \['video'\], fps=8.0.*part 0 .* fps=12.0"):
        MediaSamples.cat([parts[0].split()[0], MediaSamples(video=video[:1], fps=8)])
    with pytest.raises(RewardInputError, match="different"):
        MediaSamples.cat([MediaSamples(video=_video(t=2), fps=8), MediaSamples(video=_video(t=3), fps=8)])


def test_the_async_scorer_batches_one_sample_media():
    from omni_rl.reward.async_scorer import AsyncRewardScorer

    video = torch.randint(0, 256, (5, 3, 2, 2, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    media = MediaSamples(video=video, fps=8)
    manager = RewardManager([RewardSpec("video_brightness"), RewardSpec("brightness", 0.5, video_frames=2)])
    prompts = [f"p{i}" for i in range(5)]
    whole = manager.score(media, prompts)
    scorer = AsyncRewardScorer(manager, max_batch_size=2, max_wait_ms=20)
    try:
        out = scorer.gather([scorer.submit(s, p, {}) for s, p in zip(media.split(), prompts)], timeout_s=30)
    finally:
        scorer.close()
    torch.testing.assert_close(out.total, whole.total)
