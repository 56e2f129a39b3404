"""rewards/jpeg.py: JPEG (in)compressibility, checked against PIL directly."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import build_reward

PROMPTS = ["flat", "noise"]
META = [{}, {}]


def _flat_and_noise(size=64):
    flat = np.full((size, size, 3), 128, dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return torch.from_numpy(np.stack([flat, noise]))


def _pil_kb(image, quality=95):
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.tell() / 1000


def test_flat_image_is_more_compressible_than_noise():
    scores = build_reward("jpeg_compressibility")(_flat_and_noise(), PROMPTS, META)
    assert isinstance(scores, list) and all(isinstance(s, float) for s in scores)
    assert scores[0] > scores[1]
    assert all(s < 0 for s in scores)


def test_incompressibility_is_the_negative():
    images = _flat_and_noise()
    comp = build_reward("jpeg_compressibility")(images, PROMPTS, META)
    incomp = build_reward("jpeg_incompressibility")(images, PROMPTS, META)
    assert incomp == [-c for c in comp]
    assert incomp[1] > incomp[0]


def test_values_match_pil_on_a_hand_built_image():
    # left half red, right half a horizontal grey ramp
    image = np.zeros((32, 48, 3), dtype=np.uint8)
    image[:, :24] = (255, 0, 0)
    image[:, 24:] = np.linspace(0, 255, 24, dtype=np.uint8)[None, :, None]
    expected_kb = _pil_kb(Image.fromarray(image))
    scores = build_reward("jpeg_incompressibility")(torch.from_numpy(image)[None], ["p"], [{}])
    assert scores == [pytest.approx(expected_kb, abs=0)]
    scaled = build_reward("jpeg_compressibility", scale=0.002)(torch.from_numpy(image)[None], ["p"], [{}])
    assert scaled == [pytest.approx(-expected_kb / 500)]
    low_quality = build_reward("jpeg_incompressibility", quality=10)(torch.from_numpy(image)[None], ["p"], [{}])
    assert low_quality == [pytest.approx(_pil_kb(Image.fromarray(image), quality=10))]


def test_pil_list_and_tensor_give_identical_scores():
    images = _flat_and_noise(size=40)
    pils = [Image.fromarray(a) for a in images.numpy()]
    scorer = build_reward("jpeg_compressibility")
    assert scorer(pils, PROMPTS, META) == scorer(images, PROMPTS, META)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"scale": 0.0}, "scale=0.0"),
    ({"scale": -1.0}, "scale=-1.0"),
    ({"scale": float("nan")}, "scale=nan"),
    ({"quality": 0}, "quality=0"),
    ({"quality": 95.5}, "quality=95.5"),
])
def test_bad_options(kwargs, pattern):
    with pytest.raises(ValueError, match=f"jpeg_compressibility: {pattern}"):
        build_reward("jpeg_compressibility", **kwargs)


def test_input_contract_is_checked():
    scorer = build_reward("jpeg_compressibility")
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        scorer(_flat_and_noise(), ["p"], META)
    with pytest.raises(ValueError, match="expected uint8"):
        scorer(torch.rand(2, 8, 8, 3), PROMPTS, META)
