"""rewards/image_stats.py: brightness, saturation, contrast on hand-built images."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import build_reward


def _solid(*rgb, size=(6, 4)):
    """One uint8 [H, W, 3] image filled with the colour rgb."""
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (*size, 3)).copy()


def _score(name, *images):
    batch = torch.from_numpy(np.stack(images))
    n = len(images)
    return build_reward(name)(batch, ["p"] * n, [{}] * n)


def test_brightness_white_black_and_bt601_weights():
    scores = _score("brightness", _solid(255, 255, 255), _solid(0, 0, 0), _solid(255, 0, 0),
                    _solid(0, 255, 0), _solid(0, 0, 255), _solid(51, 51, 51))
    assert scores[0] == 1.0 and scores[1] == 0.0  # exact: integer luma
    assert scores[2:5] == pytest.approx([0.299, 0.587, 0.114])
    assert scores[5] == pytest.approx(0.2)


def test_brightness_averages_over_pixels():
    half = _solid(0, 0, 0)
    half[:, :2] = 255  # half the columns white
    assert _score("brightness", half) == [pytest.approx(0.5)]


def test_saturation():
    pastel = _solid(200, 100, 100)  # (200 - 100) / 200
    scores = _score("saturation", _solid(128, 128, 128), _solid(0, 0, 0), _solid(255, 0, 0), pastel)
    assert scores == pytest.approx([0.0, 0.0, 1.0, 0.5])


def test_contrast():
    checker = _solid(0, 0, 0)
    checker[::2, ::2] = 255
    checker[1::2, 1::2] = 255  # half the pixels white: std of {0, 1} in equal parts = 0.5
    scores = _score("contrast", _solid(90, 30, 200), checker)
    assert scores == pytest.approx([0.0, 0.5])


@pytest.mark.parametrize("name", ["brightness", "saturation", "contrast"])
def test_pil_list_and_tensor_agree_and_batching_matches_a_loop(name):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (3, 9, 5, 3), dtype=np.uint8)
    scorer = build_reward(name)
    batched = scorer(torch.from_numpy(images), ["p"] * 3, [{}] * 3)
    assert batched == scorer([Image.fromarray(a) for a in images], ["p"] * 3, [{}] * 3)
    one_by_one = [scorer(torch.from_numpy(a[None]), ["p"], [{}])[0] for a in images]
    assert batched == pytest.approx(one_by_one, abs=1e-12)
    assert all(isinstance(s, float) for s in batched)


def test_grey_pil_image_is_scored_as_rgb():
    assert build_reward("brightness")([Image.new("L", (3, 3), 255)], ["p"], [{}]) == [1.0]
