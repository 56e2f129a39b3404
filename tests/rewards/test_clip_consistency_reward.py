"""rewards/clip_consistency.py: the mean cosine of consecutive frames' CLIP embeddings, on a tiny CLIP."""
import numpy as np
import pytest
import torch

from omni_rl.reward import MediaSamples, RewardConfigError, RewardInputError, build_reward
from rewards.clip_embedder import ClipEmbedder


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8))  # frames A, B, C


def test_consecutive_cosines_averaged(frames):
    a, b, c = frames
    videos = torch.stack([torch.stack([a, a, a, a]), torch.stack([a, b, a, b]), torch.stack([a, b, c, c])])
    scorer = build_reward("clip_frame_consistency", model="tiny:clip-reward")
    scores = scorer(MediaSamples(video=videos, fps=8.0), ["x"] * 3, [{}] * 3)
    e = ClipEmbedder("test", "tiny:clip-reward", None, "cpu").images(frames)
    ab, bc = float(e[0] @ e[1]), float(e[1] @ e[2])
    # A still video: every cosine is 1. A B A B: three pairs, each cos(A, B).
    # A B C C: (cos(A, B) + cos(B, C) + 1) / 3.
    assert scores == pytest.approx([1.0, ab, (ab + bc + 1.0) / 3], abs=1e-5)
    assert ab < 0.999  # the frames differ to CLIP, so the cases above are distinct


def test_frames_picks_evenly_spaced_frames_and_never_repeats_one(frames):
    a, b, c = frames
    video = torch.stack([a, b, b, c])[None]
    e = ClipEmbedder("test", "tiny:clip-reward", None, "cpu").images(frames)
    # frames=2: the first and the last frame only; frames=8 on 4 frames: all four, once each.
    two = build_reward("clip_frame_consistency", model="tiny:clip-reward", frames=2)(MediaSamples(video=video, fps=8.0), ["x"], [{}])
    eight = build_reward("clip_frame_consistency", model="tiny:clip-reward", frames=8)(MediaSamples(video=video, fps=8.0), ["x"], [{}])
    assert two == pytest.approx([float(e[0] @ e[2])], abs=1e-5)
    assert eight == pytest.approx([(float(e[0] @ e[1]) + 1.0 + float(e[1] @ e[2])) / 3], abs=1e-5)


def test_one_frame_is_consistent_and_bad_input_is_named(frames):
    scorer = build_reward("clip_frame_consistency", model="tiny:clip-reward")
    assert scorer(MediaSamples(video=frames[:1][None], fps=8.0), ["x"], [{}]) == [1.0]
    with pytest.raises(RewardInputError, match="clip_frame_consistency: scores video"):
        scorer(frames, ["x"] * 3, [{}] * 3)
    with pytest.raises(RewardConfigError, match="frames=1"):
        build_reward("clip_frame_consistency", model="tiny:clip-reward", frames=1)
