"""Checks and converts the inputs every reward scorer receives.

A scorer is called as `scorer(images, prompts, metadata)` where

- `images` is either a list of PIL images or a `torch.uint8` tensor `[B, H, W, C]` (a uint8
  numpy array of the same shape is accepted too), pixel values 0..255, channels last;
- `prompts` is a list of B strings, one per image;
- `metadata` is a list of B dicts, one per image.

`check_batch` validates the three together and returns B. `to_uint8_numpy` and `to_pil_list`
turn either image form into the one a scorer wants, always RGB, so a scorer gives identical
scores for a PIL list and for the equivalent tensor.

What is refused, rather than silently corrected (each error says how to fix the input):
- float tensors (a [0, 1] float and a [0, 255] float look alike; the caller knows which it has),
- channels-first tensors `[B, C, H, W]`,
- images with an alpha channel (dropping alpha changes what the image looks like),
- PIL images of different sizes in one batch (they cannot be stacked into one array),
- an empty batch.
Grey images (PIL mode "L" or C == 1) are expanded to RGB; other PIL modes without alpha
("P", "CMYK", ...) go through PIL's own `convert("RGB")`.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np
import torch
from PIL import Image

Images = Union[Sequence[Image.Image], torch.Tensor, np.ndarray]

# PIL modes that carry transparency; see the module docstring for why they are refused.
_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}


class RewardInputError(ValueError):
    """The images, prompts or metadata handed to a reward do not follow the scorer contract."""


def batch_size(images: Images) -> int:
    """Number of images in `images` (list of PIL images or [B, H, W, C] array/tensor)."""
    if isinstance(images, (torch.Tensor, np.ndarray)):
        _check_array_shape(images)
        return int(images.shape[0])
    if isinstance(images, Image.Image):
        raise RewardInputError(
            "images is a single PIL image; expected a list of PIL images, one per sample. "
            "Wrap it: [image]"
        )
    if isinstance(images, (list, tuple)):
        return len(images)
    raise RewardInputError(
        f"images has type {type(images).__name__}; expected a list of PIL images or a uint8 "
        f"tensor [B, H, W, C]"
    )


def check_batch(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> int:
    """Validate one scorer call's inputs; return the batch size B (>= 1).

    Lengths must agree (one prompt and one metadata dict per image), prompts must be strings
    and metadata entries dicts. The pixel contents are checked by `to_uint8_numpy`.
    """
    n = batch_size(images)
    if n == 0:
        raise RewardInputError("images is an empty batch; a reward needs at least one image")
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        raise RewardInputError(
            f"prompts has type {type(prompts).__name__}; expected a list of {n} strings, one per image"
        )
    if len(prompts) != n:
        raise RewardInputError(
            f"got {n} images but {len(prompts)} prompts; pass exactly one prompt per image "
            f"(repeat a prompt for each of its samples)"
        )
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise RewardInputError(f"prompts[{i}] has type {type(prompt).__name__}; expected str")
    if not isinstance(metadata, (list, tuple)):
        raise RewardInputError(
            f"metadata has type {type(metadata).__name__}; expected a list of {n} dicts, one per "
            f"image (use [{{}}] * {n} when there is none)"
        )
    if len(metadata) != n:
        raise RewardInputError(
            f"got {n} images but {len(metadata)} metadata entries; pass exactly one dict per image"
        )
    for i, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise RewardInputError(f"metadata[{i}] has type {type(meta).__name__}; expected dict")
    return n


def to_uint8_numpy(images: Images) -> np.ndarray:
    """Return the images as one RGB uint8 numpy array [B, H, W, 3] (a copy only when needed)."""
    if isinstance(images, (torch.Tensor, np.ndarray)):
        _check_array_shape(images)
        array = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else images
        if array.shape[-1] == 1:
            array = np.repeat(array, 3, axis=-1)
        return array
    n = batch_size(images)
    if n == 0:
        raise RewardInputError("images is an empty batch; a reward needs at least one image")
    arrays = [np.asarray(_pil_to_rgb(image, i)) for i, image in enumerate(images)]
    sizes = {a.shape for a in arrays}
    if len(sizes) > 1:
        raise RewardInputError(
            f"the PIL images have different sizes {sorted((s[1], s[0]) for s in sizes)} (W, H); "
            f"a batch must share one size: resize them first, or score them in separate calls"
        )
    return np.stack(arrays)


def to_pil_list(images: Images) -> list[Image.Image]:
    """Return the images as a list of RGB PIL images (RGB PIL inputs are passed through)."""
    if isinstance(images, (torch.Tensor, np.ndarray)):
        return [Image.fromarray(a) for a in to_uint8_numpy(images)]
    batch_size(images)  # type check with a clear message
    return [_pil_to_rgb(image, i) for i, image in enumerate(images)]


def _pil_to_rgb(image: Any, index: int) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise RewardInputError(
            f"images[{index}] has type {type(image).__name__}; expected a PIL image (or pass all "
            f"images as one uint8 tensor [B, H, W, C])"
        )
    if image.mode == "RGB":
        return image
    if image.mode in _ALPHA_MODES:
        raise RewardInputError(
            f"images[{index}] has mode {image.mode!r}, which has an alpha channel; rewards score RGB "
            f"images. Composite it onto a background or drop alpha explicitly with "
            f"image.convert('RGB')"
        )
    return image.convert("RGB")


def _check_array_shape(images: torch.Tensor | np.ndarray) -> None:
    dtype_ok = images.dtype == torch.uint8 if isinstance(images, torch.Tensor) else images.dtype == np.uint8
    if not dtype_ok:
        raise RewardInputError(
            f"images has dtype {images.dtype}; expected uint8 [B, H, W, C] with values 0..255. "
            f"Convert a [0, 1] float tensor with (images.clamp(0, 1) * 255).round().to(torch.uint8) "
            f"(and .permute(0, 2, 3, 1) if it is channels-first)"
        )
    shape = tuple(images.shape)
    if len(shape) != 4:
        hint = " (one image? add the batch dim with images[None])" if len(shape) == 3 else ""
        raise RewardInputError(f"images has shape {shape}; expected 4 dims [B, H, W, C]{hint}")
    channels = shape[-1]
    if channels in (1, 3):
        return
    if shape[1] in (1, 3, 4) and channels != 4:
        raise RewardInputError(
            f"images has shape {shape}, which looks channels-first [B, C, H, W]; expected channels "
            f"last [B, H, W, C]: use images.permute(0, 2, 3, 1)"
        )
    if channels == 4:
        raise RewardInputError(
            f"images has shape {shape} with 4 channels (RGBA); rewards score RGB images. Drop or "
            f"composite the alpha channel first, e.g. images[..., :3]"
        )
    raise RewardInputError(f"images has shape {shape}; expected C = 3 (RGB) or 1 (grey) in [B, H, W, C]")
