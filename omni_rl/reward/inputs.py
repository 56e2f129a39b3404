"""Checks and converts the inputs every reward scorer receives: `scorer(samples, prompts, metadata)`.

`check_batch` validates a batch (B images or response strings, B prompts, B metadata dicts),
`sample_kind` names its kind, `to_uint8_numpy` / `to_pil_list` / `to_text_list` convert and
`ground_truths` fetches `metadata[i]["ground_truth"]`. Odd inputs (float or channels-first
tensors, alpha channels, mixed lists) are refused with a fix, never corrected.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np
import torch
from PIL import Image

Images = Union[Sequence[Image.Image], torch.Tensor, np.ndarray]
Texts = Sequence[str]
Samples = Union[Images, Texts]

IMAGES = "images"
TEXTS = "texts"

# PIL modes that carry transparency; see the module docstring for why they are refused.
_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}


class RewardInputError(ValueError):
    """The samples, prompts or metadata handed to a reward do not follow the scorer contract."""


def sample_kind(samples: Samples) -> str:
    """`TEXTS` ("texts") for a list/tuple whose first element is a str, else `IMAGES` ("images").

    Only the first element is looked at (an empty list counts as images); `check_batch`
    checks that a text batch holds nothing but strings.
    """
    if isinstance(samples, (list, tuple)) and samples and isinstance(samples[0], str):
        return TEXTS
    return IMAGES


def batch_size(samples: Samples) -> int:
    """Number of samples in `samples` (list of PIL images, [B, H, W, C] array/tensor, list of str)."""
    if isinstance(samples, (torch.Tensor, np.ndarray)):
        _check_array_shape(samples)
        return int(samples.shape[0])
    if isinstance(samples, Image.Image):
        raise RewardInputError(
            "images is a single PIL image; expected a list of PIL images, one per sample. "
            "Wrap it: [image]"
        )
    if isinstance(samples, str):
        raise RewardInputError(
            f"samples is a single string ({_preview(samples)}); expected a list of strings, one "
            f"generated text per sample. Wrap it: [text]"
        )
    if isinstance(samples, (list, tuple)):
        return len(samples)
    raise RewardInputError(
        f"samples has type {type(samples).__name__}; expected a list of PIL images, a uint8 "
        f"tensor [B, H, W, C], or a list of strings (generated texts)"
    )


def check_batch(samples: Samples, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> int:
    """Validate one scorer call's inputs; return the batch size B (>= 1).

    Lengths must agree (one prompt and one metadata dict per sample), prompts must be strings
    and metadata entries dicts; a text batch must hold only strings. The pixel contents of an
    image batch are checked by `to_uint8_numpy`.
    """
    n = batch_size(samples)
    if n == 0:
        raise RewardInputError("samples is an empty batch; a reward needs at least one sample")
    kind = sample_kind(samples)
    if kind == TEXTS:
        _check_all_strings(samples)
    check_prompts_metadata(n, prompts, metadata, kind)
    return n


def check_prompts_metadata(
    n: int, prompts: Sequence[str], metadata: Sequence[dict[str, Any]], kind: str = "samples", reward: str = "",
) -> None:
    """One prompt string and one metadata dict for each of the `n` samples (`kind` names them
    in the errors; `reward`, when given, prefixes them). Scorers that check their own sample
    type (audio, video) call this for the rest of the batch."""
    who = f"{reward}: " if reward else ""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        raise RewardInputError(
            f"{who}prompts has type {type(prompts).__name__}; expected a list of {n} strings, one per sample"
        )
    if len(prompts) != n:
        raise RewardInputError(
            f"{who}got {n} {kind} but {len(prompts)} prompts; expected a list of {n} prompt strings, one "
            f"per sample (repeat a prompt for each of its samples)"
        )
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise RewardInputError(f"{who}prompts[{i}] has type {type(prompt).__name__}; expected str")
    if not isinstance(metadata, (list, tuple)):
        raise RewardInputError(
            f"{who}metadata has type {type(metadata).__name__}; expected a list of {n} dicts, one per "
            f"sample (use [{{}}] * {n} when there is none)"
        )
    if len(metadata) != n:
        raise RewardInputError(
            f"{who}got {n} {kind} but {len(metadata)} metadata entries; pass exactly one dict per sample"
        )
    for i, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise RewardInputError(f"{who}metadata[{i}] has type {type(meta).__name__}; expected dict")


def to_text_list(samples: Samples) -> list[str]:
    """Return a text batch as a list of str; raise if `samples` holds images (or anything else)."""
    n = batch_size(samples)
    if n == 0:
        raise RewardInputError("samples is an empty batch; a reward needs at least one sample")
    if sample_kind(samples) != TEXTS:
        what = f"a {type(samples).__name__}" if not isinstance(samples, (list, tuple)) else (
            f"a list of {type(samples[0]).__name__}"
        )
        raise RewardInputError(
            f"this reward scores text, but the samples are images ({what} of {n}); use it on "
            f"a text/omni recipe whose rollout generates text, or pick an image reward"
        )
    _check_all_strings(samples)
    return list(samples)


def ground_truths(metadata: Sequence[dict[str, Any]], reward: str) -> list[Any]:
    """`metadata[i]["ground_truth"]` for every i; a missing (or None) one raises naming index i."""
    out = []
    for i, meta in enumerate(metadata):
        value = meta.get("ground_truth") if isinstance(meta, dict) else None
        if value is None:
            keys = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
            raise RewardInputError(
                f"reward {reward!r}: metadata[{i}] has no 'ground_truth' (its keys: {keys}); this "
                f"reward compares each response with the reference answer in "
                f"metadata['ground_truth']. Add a 'ground_truth' field to every row of the prompt "
                f"data (chat .jsonl/.parquet rows carry it at the top level)"
            )
        out.append(value)
    return out


def to_uint8_numpy(images: Images) -> np.ndarray:
    """Return the images as one RGB uint8 numpy array [B, H, W, 3] (a copy only when needed)."""
    _refuse_texts(images)
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
    _refuse_texts(images)
    if isinstance(images, (torch.Tensor, np.ndarray)):
        return [Image.fromarray(a) for a in to_uint8_numpy(images)]
    batch_size(images)  # type check with a clear message
    return [_pil_to_rgb(image, i) for i, image in enumerate(images)]


def _refuse_texts(samples: Samples) -> None:
    if sample_kind(samples) == TEXTS:
        raise RewardInputError(
            f"this reward scores images, but the samples are text (a list of {len(samples)} "
            f"strings, e.g. {_preview(samples[0])}); use it on an image/video recipe, or pick a "
            f"text reward (math_answer, multiple_choice, format, ...) for a text recipe"
        )


def _check_all_strings(samples: Sequence[Any]) -> None:
    for i, text in enumerate(samples):
        if not isinstance(text, str):
            raise RewardInputError(
                f"samples[{i}] has type {type(text).__name__} but samples[0] is a str; a batch is "
                f"either all generated texts (str) or all images, not a mix"
            )


def _preview(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


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
