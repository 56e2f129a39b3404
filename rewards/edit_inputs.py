"""The input contract of the image-editing rewards: each sample's source image, from its metadata.

An edit prompt file puts the source image in every prompt's `metadata["source_image"]` (a PIL
image, or the PNG data URI the reward protocol makes of it, so the rewards also run behind the
reference server); a sample without one raises `RewardInputError` saying the reward needs an
edit dataset, and `check_source_image`, the edit rewards' `check_item`, stops such a prompt file
before any model loads.

    sources = source_images(metadata, "edit_brightness")   # B RGB PIL images
"""
from __future__ import annotations

from typing import Any, Sequence

from PIL import Image

from omni_rl.data.edit_prompts import SOURCE_IMAGE
from omni_rl.reward import RewardInputError
from omni_rl.reward.protocol import WIRE_IMAGE_PREFIX, ProtocolError, image_from_wire

_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}


def source_images(metadata: Sequence[dict[str, Any]], reward: str) -> list[Image.Image]:
    """`metadata[i]["source_image"]` for every i, as RGB PIL images (rules in the module docstring)."""
    missing = [i for i, meta in enumerate(metadata) if meta.get(SOURCE_IMAGE) is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise RewardInputError(
            f"reward {reward!r}: metadata[i][{SOURCE_IMAGE!r}] is missing for sample(s) {shown} of "
            f"{len(metadata)} (keys of metadata[{missing[0]}]: {sorted(metadata[missing[0]])}); this reward "
            f"scores an edit against its source image, so it needs an edit dataset: a prompt file whose "
            f"rows carry 'source_image' (see omni_rl/data/edit_prompts.py)"
        )
    return [_rgb(meta[SOURCE_IMAGE], f"reward {reward!r}: metadata[{i}][{SOURCE_IMAGE!r}]")
            for i, meta in enumerate(metadata)]


def check_source_image(prompt: str, metadata: dict[str, Any]) -> str | None:
    """Why this prompt cannot be scored by an edit reward (no source image in its metadata), or None."""
    if metadata.get(SOURCE_IMAGE) is not None:
        return None
    return (f"has no source image: its metadata has no {SOURCE_IMAGE!r} (keys: {sorted(metadata)}); the edit rewards "
            f"score an edit against its source, so they need an edit dataset: rows with 'source_image' (or the "
            f"peers' 'image', or verl-omni's image_edit rows; see omni_rl/data/edit_prompts.py)")


def _rgb(value: Any, where: str) -> Image.Image:
    if isinstance(value, str) and value.startswith(WIRE_IMAGE_PREFIX):
        try:
            return image_from_wire(value, where)
        except ProtocolError as err:
            raise RewardInputError(str(err)) from None
    if not isinstance(value, Image.Image):
        raise RewardInputError(
            f"{where} has type {type(value).__name__}; expected a PIL image (what an edit prompt file "
            f"loads) or a PNG data URI {WIRE_IMAGE_PREFIX!r}..."
        )
    if value.mode == "RGB":
        return value
    if value.mode in _ALPHA_MODES:
        raise RewardInputError(
            f"{where} has mode {value.mode!r}, with an alpha channel; the edit rewards compare RGB "
            f"images: composite it onto a background first (the edit prompt reader does, onto white)"
        )
    return value.convert("RGB")
