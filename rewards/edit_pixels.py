"""Cheap, weight-free image-editing rewards, for the CPU edit demo and smoke tests.

Both compare each edit with its `metadata["source_image"]` (an edit dataset is required) and take
no options. `edit_brightness` is direction x (mean luma(edit) - mean luma(source)) in [-1, 1], the
direction `metadata["brightness_direction"]` or read from the instruction ("brighter", "lighten",
... +1; "darker", "darken" -1; neither or both is refused when the prompts load).
`source_consistency` is 1 - mean |edit - source| / 255. Together they make a toy task whose
optimum is not trivial: `edit_brightness` alone learns to paint white or black.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
from PIL import Image

from omni_rl.reward import Images, RewardInputError, check_batch, register_reward, to_uint8_numpy
from rewards.edit_inputs import check_source_image, source_images
from rewards.image_stats import mean_luma

DIRECTION_KEY = "brightness_direction"
_BRIGHTER = re.compile(r"\b(brighter|lighter|brighten|lighten)\b", re.IGNORECASE)
_DARKER = re.compile(r"\b(darker|darken)\b", re.IGNORECASE)


def brightness_direction(prompt: str, metadata: dict[str, Any], index: int) -> int:
    """+1 (brighter) or -1 (darker) for sample `index` (rules in the module docstring)."""
    if metadata.get(DIRECTION_KEY) is not None:
        value = metadata[DIRECTION_KEY]
        if isinstance(value, bool) or value not in (1, -1):
            raise RewardInputError(
                f"edit_brightness: metadata[{index}][{DIRECTION_KEY!r}] is {value!r}; expected +1 "
                f"(brighter) or -1 (darker)"
            )
        return int(value)
    brighter, darker = bool(_BRIGHTER.search(prompt)), bool(_DARKER.search(prompt))
    if brighter != darker:
        return 1 if brighter else -1
    found = "both 'brighter'/'lighter' and 'darker'" if brighter else "neither 'brighter'/'lighter' nor 'darker'"
    raise RewardInputError(
        f"edit_brightness: prompt {index} ({prompt!r}) says {found}, so the wanted direction is "
        f"unknown; put metadata {{{DIRECTION_KEY!r}: 1 or -1}} in the prompt file's row, or word "
        f"the instruction with one of them"
    )


def _edit_brightness(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    check_batch(images, prompts, metadata)
    sources = source_images(metadata, "edit_brightness")
    directions = np.array([brightness_direction(p, m, i) for i, (p, m) in enumerate(zip(prompts, metadata))])
    cache: dict[int, float] = {}  # a group's samples share their source: one luma each
    for source in sources:
        if id(source) not in cache:
            cache[id(source)] = float(mean_luma(np.asarray(source)[None])[0])
    source_luma = np.array([cache[id(s)] for s in sources])
    return (directions * (mean_luma(to_uint8_numpy(images)) - source_luma)).tolist()


def _source_consistency(images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
    check_batch(images, prompts, metadata)
    edits = to_uint8_numpy(images)
    height, width = edits.shape[1:3]
    sources = source_images(metadata, "source_consistency")
    resized: dict[int, np.ndarray] = {}
    for source in sources:
        if id(source) not in resized:
            same = source.size == (width, height)
            resized[id(source)] = np.asarray(source if same else source.resize((width, height), Image.BILINEAR))
    stacked = np.stack([resized[id(s)] for s in sources])
    difference = np.abs(edits.astype(np.int16) - stacked.astype(np.int16))
    return (1.0 - difference.mean(axis=(1, 2, 3), dtype=np.float64) / 255.0).tolist()


def _check_directions(prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> None:
    """Every prompt's direction is known (at load: a bad row stops the run before any model loads)."""
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        brightness_direction(prompt, meta, i)


@register_reward("edit_brightness", modalities={"image"}, check_prompts=_check_directions, check_item=check_source_image)
def edit_brightness():
    """direction * (mean luma(edit) - mean luma(source)), in [-1, 1]."""
    return _edit_brightness


@register_reward("source_consistency", modalities={"image"}, check_item=check_source_image)
def source_consistency():
    """1 - mean |edit - source (resized to the edit)| / 255, in [0, 1]."""
    return _source_consistency
