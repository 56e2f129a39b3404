"""Cheap, weight-free image statistics as rewards, for CPU demos and smoke tests.

Vectorised over the uint8 RGB batch, prompts ignored, no options: `brightness` (mean BT.601 luma
/ 255), `saturation` (mean HSV saturation), `contrast` (the luma's population std, at most 0.5).
They show a loop moving a number, not image quality: maximising brightness alone paints white.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from omni_rl.reward import Images, check_batch, register_reward, to_uint8_numpy

# BT.601 luma weights in thousandths: integer maths keeps white at exactly 1.0 and uses 4
# bytes per pixel (a float64 copy of a batch of 1024^2 images would not be cheap).
_LUMA_WEIGHTS_MILLI = np.array([299, 587, 114], dtype=np.int32)
_LUMA_MAX = 255 * 1000


def _luma_milli(pixels: np.ndarray) -> np.ndarray:
    """[B, H, W, 3] uint8 -> [B, H, W] int32 luma x 1000, in 0..255000."""
    return pixels.astype(np.int32) @ _LUMA_WEIGHTS_MILLI


def mean_luma(pixels: np.ndarray) -> np.ndarray:
    """[B, H, W, 3] uint8 RGB -> [B] float64 mean BT.601 luma in [0, 1] (the `brightness` reward;
    the edit rewards in `rewards.edit_pixels` use it too)."""
    luma = _luma_milli(pixels)
    return luma.sum(axis=(1, 2), dtype=np.int64) / (_LUMA_MAX * luma[0].size)


def _brightness(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    check_batch(images, prompts, metadata)
    return mean_luma(to_uint8_numpy(images)).tolist()


def _saturation(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    check_batch(images, prompts, metadata)
    pixels = to_uint8_numpy(images)
    high = pixels.max(axis=-1).astype(np.float32)
    low = pixels.min(axis=-1).astype(np.float32)
    # max(high, 1) only guards black pixels, where high - low = 0 and the saturation is 0 anyway.
    saturation = (high - low) / np.maximum(high, 1.0)
    return saturation.mean(axis=(1, 2), dtype=np.float64).tolist()


def _contrast(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    check_batch(images, prompts, metadata)
    luma = _luma_milli(to_uint8_numpy(images)).astype(np.float32) / _LUMA_MAX
    return luma.std(axis=(1, 2), dtype=np.float64).tolist()


@register_reward("brightness")
def brightness():
    """Mean BT.601 luma in [0, 1]."""
    return _brightness


@register_reward("saturation")
def saturation():
    """Mean HSV saturation in [0, 1]."""
    return _saturation


@register_reward("contrast")
def contrast():
    """RMS contrast (std of the luma) in [0, 0.5]."""
    return _contrast
