"""Writes the tiny image-editing dataset of the CPU edit demo: `tiny_edit.jsonl` and its sources.

    python recipes/prompts/make_tiny_edit.py          # from the repository root; rewrites both

Eight 32x32 RGB PNGs in `recipes/prompts/tiny_edit/`, each a flat colour with a centred 16x16
square of a darker shade of it (so an edit that repaints the whole picture loses
`source_consistency`), in clearly different colours and brightnesses: dark sources are asked to
become brighter, bright ones darker. Each row of `tiny_edit.jsonl` (the format of
`omni_rl/data/edit_prompts.py`) gives the instruction, the source path (relative to the
.jsonl's folder), captions of source and result (for `clip_directional`) and
`metadata.brightness_direction` (for `edit_brightness`).

Deterministic: no randomness, plain pixel maths, so a rerun writes the same pixels (and, with
the same Pillow/zlib, the same bytes).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
SIZE = 32
# (file stem, RGB, colour word, brightness word, instruction, direction)
ROWS = [
    ("dark_red", (110, 20, 20), "red", "dark", "make it brighter", 1),
    ("light_blue", (150, 185, 245), "blue", "light", "make it darker", -1),
    ("dark_green", (20, 85, 35), "green", "dark", "make the picture lighter", 1),
    ("bright_yellow", (245, 225, 70), "yellow", "bright", "make it darker", -1),
    ("dim_grey", (60, 60, 60), "grey", "dim", "make it brighter", 1),
    ("pale_pink", (250, 205, 215), "pink", "pale", "make the image darker", -1),
    ("navy", (20, 30, 95), "blue", "deep", "brighten it: make it brighter", 1),
    ("bright_orange", (250, 155, 45), "orange", "bright", "make the whole picture darker", -1),
]


def source_pixels(rgb: tuple[int, int, int]) -> np.ndarray:
    """[SIZE, SIZE, 3] uint8: the colour, with a centred square at 0.6 of its values."""
    pixels = np.empty((SIZE, SIZE, 3), dtype=np.uint8)
    pixels[:] = rgb
    quarter = SIZE // 4
    pixels[quarter : SIZE - quarter, quarter : SIZE - quarter] = (np.array(rgb) * 0.6).round().astype(np.uint8)
    return pixels


def main() -> None:
    folder = HERE / "tiny_edit"
    folder.mkdir(exist_ok=True)
    lines = []
    for stem, rgb, colour, shade, instruction, direction in ROWS:
        Image.fromarray(source_pixels(rgb)).save(folder / f"{stem}.png")
        wanted = "brighter" if direction > 0 else "darker"
        lines.append(json.dumps({
            "instruction": instruction,
            "source_image": f"tiny_edit/{stem}.png",
            "source_text": f"a {shade} {colour} picture",
            "target_text": f"a {wanted} {colour} picture",
            "metadata": {"brightness_direction": direction},
        }))
    (HERE / "tiny_edit.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
