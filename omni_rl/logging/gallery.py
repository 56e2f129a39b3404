"""Sample galleries: tile generated images into one captioned grid image.

`make_grid(images, nrow, captions, marks)` tiles uint8 images with captions and optional
green/red frames; `save_grid(...)` writes it atomically. Left out on purpose: video and audio.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from omni_rl.utils.atomic import atomic_save_image

_BACKGROUND = (255, 255, 255)
_TEXT_COLOR = (0, 0, 0)
_MARK_COLORS = {True: (0, 170, 0), False: (220, 0, 0)}
_ELLIPSIS = "..."  # ASCII: the default font may have no glyph for the single-character one


def _to_pil_list(images: Any) -> list[Image.Image]:
    """Normalise the accepted inputs into a list of RGB PIL images of one size."""
    if isinstance(images, Image.Image):
        raise TypeError("make_grid expects a batch of images; wrap a single PIL image in a list: [image]")
    if isinstance(images, (list, tuple)):
        if not all(isinstance(image, Image.Image) for image in images):
            kinds = sorted({type(image).__name__ for image in images})
            raise TypeError(f"a list given to make_grid must hold PIL images only, got {kinds}")
        tiles = [image.convert("RGB") for image in images]
    else:
        array = images.detach().cpu().numpy() if hasattr(images, "detach") else np.asarray(images)
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] not in (1, 3, 4):
            raise ValueError(
                f"make_grid expects uint8 images shaped [B, H, W, C] with C in 1, 3, 4, got dtype "
                f"{array.dtype} shape {tuple(array.shape)}; convert floats in [0, 1] with "
                f"(x.clamp(0, 1) * 255).round().to(torch.uint8) and move channels last"
            )
        if array.shape[-1] == 1:
            array = np.repeat(array, 3, axis=-1)
        tiles = [Image.fromarray(np.ascontiguousarray(image)).convert("RGB") for image in array]
    if not tiles:
        raise ValueError("make_grid got no images; pass at least one")
    sizes = sorted({tile.size for tile in tiles})
    if len(sizes) > 1:
        raise ValueError(
            f"make_grid needs images of one size, got (width, height) sizes {sizes}; resize them first"
        )
    return tiles


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font: Any, max_width: int) -> str:
    """`text` on one line, cut and ended with "..." so it is at most `max_width` pixels wide."""
    text = " ".join(text.split())  # newlines would spill into the next tile
    if draw.textlength(text, font=font) <= max_width:
        return text
    # Binary search for the longest prefix that still fits together with the ellipsis.
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if draw.textlength(text[:mid] + _ELLIPSIS, font=font) <= max_width:
            low = mid
        else:
            high = mid - 1
    return text[:low].rstrip() + _ELLIPSIS if low else ""


def make_grid(
    images: Any,
    nrow: int,
    captions: Sequence[str] | None = None,
    padding: int = 4,
    font_size: int = 12,
    min_tile_size: int = 128,
    marks: Sequence[bool | None] | None = None,
) -> Image.Image:
    """Tile `images` into one RGB image, `nrow` images to a row, optional caption under each.

    Tiles under `min_tile_size` are enlarged by an integer factor (nearest neighbour), so tiny
    samples and their captions stay readable.
    """
    if isinstance(nrow, bool) or not isinstance(nrow, int) or nrow < 1:
        raise ValueError(f"nrow (images per row) must be an int >= 1, got {nrow!r}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0 pixels, got {padding!r}")
    tiles = _to_pil_list(images)
    factor = max(1, math.ceil(min_tile_size / max(1, min(tiles[0].size))))
    if factor > 1:
        tiles = [t.resize((t.width * factor, t.height * factor), Image.NEAREST) for t in tiles]
    if captions is not None and len(captions) != len(tiles):
        raise ValueError(
            f"got {len(captions)} captions for {len(tiles)} images; pass one caption per image or None"
        )
    if marks is not None and len(marks) != len(tiles):
        raise ValueError(f"got {len(marks)} marks for {len(tiles)} images; pass one mark (True, False, None) per image")

    tile_w, tile_h = tiles[0].size
    columns = min(nrow, len(tiles))
    rows = math.ceil(len(tiles) / nrow)
    font = ImageFont.load_default(size=font_size)
    # One text line plus a small margin above and below, from the font's real extent.
    caption_h = caption_top = 0
    if captions is not None:
        _, top, _, bottom = font.getbbox("Ag|")
        margin = max(2, padding // 2)
        caption_top = margin - top  # text is drawn from its origin; `top` is the ink offset
        caption_h = bottom - top + 2 * margin

    cell_w, cell_h = tile_w + padding, tile_h + caption_h + padding
    grid = Image.new("RGB", (padding + columns * cell_w, padding + rows * cell_h), _BACKGROUND)
    draw = ImageDraw.Draw(grid)
    for index, tile in enumerate(tiles):
        x = padding + (index % nrow) * cell_w
        y = padding + (index // nrow) * cell_h
        grid.paste(tile, (x, y))
        if marks is not None and marks[index] is not None and padding > 0:
            width = max(1, padding // 2)  # half the gap: neighbouring frames meet, never overlap
            draw.rectangle((x - width, y - width, x + tile_w + width - 1, y + tile_h + width - 1),
                           outline=_MARK_COLORS[bool(marks[index])], width=width)
        if captions is not None:
            text = _fit_text(draw, str(captions[index]), font, tile_w)
            # Centred by measuring, not with `anchor=`: the bitmap fallback font has no anchors.
            text_x = x + (tile_w - draw.textlength(text, font=font)) / 2
            draw.text((text_x, y + tile_h + caption_top), text, fill=_TEXT_COLOR, font=font)
    return grid


def save_grid(
    images: Any,
    path: str | os.PathLike,
    nrow: int,
    captions: Sequence[str] | None = None,
    **grid_kwargs: Any,
) -> Path:
    """`make_grid(images, nrow, captions, **grid_kwargs)` written atomically to `path`."""
    return atomic_save_image(make_grid(images, nrow, captions, **grid_kwargs), path)
