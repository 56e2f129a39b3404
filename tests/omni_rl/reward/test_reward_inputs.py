"""Input checks and conversions shared by every scorer (omni_rl/reward/inputs.py)."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.reward import RewardInputError, batch_size, check_batch, to_pil_list, to_uint8_numpy


def _random_uint8(b=2, h=5, w=7, c=3, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (b, h, w, c), dtype=np.uint8))


def test_tensor_and_pil_round_trip():
    tensor = _random_uint8()
    pils = to_pil_list(tensor)
    assert [p.size for p in pils] == [(7, 5), (7, 5)] and all(p.mode == "RGB" for p in pils)
    back = to_uint8_numpy(pils)
    assert back.dtype == np.uint8 and back.shape == (2, 5, 7, 3)
    np.testing.assert_array_equal(back, tensor.numpy())
    np.testing.assert_array_equal(to_uint8_numpy(tensor), tensor.numpy())
    np.testing.assert_array_equal(to_uint8_numpy(tensor.numpy()), tensor.numpy())


def test_non_contiguous_tensor():
    channels_first = _random_uint8().permute(0, 3, 1, 2).contiguous()
    view = channels_first.permute(0, 2, 3, 1)  # channels-last view with odd strides
    np.testing.assert_array_equal(to_uint8_numpy(view), view.contiguous().numpy())
    np.testing.assert_array_equal(to_uint8_numpy(to_pil_list(view)), view.contiguous().numpy())


def test_grey_is_expanded_to_rgb():
    grey = torch.full((1, 2, 2, 1), 40, dtype=torch.uint8)
    assert to_uint8_numpy(grey).shape == (1, 2, 2, 3)
    assert (to_uint8_numpy(grey) == 40).all()
    pil_grey = Image.new("L", (2, 2), 40)
    np.testing.assert_array_equal(to_uint8_numpy([pil_grey]), to_uint8_numpy(grey))
    assert to_pil_list([pil_grey])[0].mode == "RGB"


def test_rgb_pil_images_pass_through():
    image = Image.new("RGB", (3, 3), (1, 2, 3))
    assert to_pil_list([image])[0] is image


def test_float_tensor_is_refused_with_the_conversion():
    with pytest.raises(RewardInputError, match=r"float32.*expected uint8 \[B, H, W, C\].*to\(torch.uint8\)"):
        to_uint8_numpy(torch.rand(2, 4, 4, 3))
    with pytest.raises(RewardInputError, match="uint8"):
        to_uint8_numpy(torch.rand(2, 4, 4, 3, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "shape, pattern",
    [
        ((2, 3, 8, 8), r"channels-first.*permute\(0, 2, 3, 1\)"),
        ((2, 8, 8, 4), "alpha"),
        ((8, 8, 3), r"4 dims.*images\[None\]"),
        ((2, 8, 8, 5), "expected C = 3"),
    ],
)
def test_bad_tensor_shapes(shape, pattern):
    with pytest.raises(RewardInputError, match=pattern):
        to_uint8_numpy(torch.zeros(shape, dtype=torch.uint8))


def test_bad_pil_lists():
    with pytest.raises(RewardInputError, match="alpha"):
        to_uint8_numpy([Image.new("RGBA", (2, 2))])
    with pytest.raises(RewardInputError, match="different sizes"):
        to_uint8_numpy([Image.new("RGB", (2, 2)), Image.new("RGB", (3, 2))])
    with pytest.raises(RewardInputError, match=r"images\[1\] has type ndarray"):
        to_uint8_numpy([Image.new("RGB", (2, 2)), np.zeros((2, 2, 3), np.uint8)])
    with pytest.raises(RewardInputError, match="single PIL image"):
        batch_size(Image.new("RGB", (2, 2)))


def test_check_batch_lengths_and_types():
    images = _random_uint8(b=2)
    assert check_batch(images, ["a", "b"], [{}, {}]) == 2
    with pytest.raises(RewardInputError, match="2 images but 1 prompts"):
        check_batch(images, ["a"], [{}, {}])
    with pytest.raises(RewardInputError, match="2 images but 3 metadata"):
        check_batch(images, ["a", "b"], [{}, {}, {}])
    with pytest.raises(RewardInputError, match="prompts has type str"):
        check_batch(images, "ab", [{}, {}])
    with pytest.raises(RewardInputError, match=r"prompts\[1\] has type int"):
        check_batch(images, ["a", 3], [{}, {}])
    with pytest.raises(RewardInputError, match=r"metadata\[0\] has type NoneType"):
        check_batch(images, ["a", "b"], [None, {}])
    with pytest.raises(RewardInputError, match="empty batch"):
        check_batch([], [], [])
