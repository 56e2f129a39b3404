"""Gallery grids: layout size, captions, inputs accepted and rejected."""
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.logging import make_grid, save_grid


def test_grid_size_b5_nrow3_no_captions():
    images = torch.zeros(5, 16, 20, 3, dtype=torch.uint8)
    grid = make_grid(images, nrow=3, padding=4, min_tile_size=0)
    # 3 columns x 2 rows of 20x16 tiles, 4 px around and between:
    # width 4 + 3 * (20 + 4) = 76, height 4 + 2 * (16 + 4) = 44.
    assert grid.size == (76, 44) and grid.mode == "RGB"
    # The empty sixth cell (row 2, column 3) stays background white.
    assert grid.getpixel((4 + 2 * 24 + 10, 4 + 24 + 8)) == (255, 255, 255)
    # The fifth tile (row 2, column 2) is pasted there.
    assert grid.getpixel((4 + 24 + 10, 4 + 24 + 8)) == (0, 0, 0)


def test_grid_with_captions_adds_a_strip_and_draws_text():
    images = torch.full((5, 16, 20, 3), 128, dtype=torch.uint8)
    plain = make_grid(images, nrow=3, padding=4, min_tile_size=0)
    captioned = make_grid(images, nrow=3, captions=[f"prompt {i} " * 10 for i in range(5)], padding=4, min_tile_size=0)
    assert captioned.width == plain.width
    assert captioned.height > plain.height
    # The strip under the first tile has dark caption pixels (truncated text still drawn).
    strip = np.asarray(captioned)[4 + 16 : 4 + 16 + (captioned.height - plain.height) // 2, 4 : 4 + 20]
    assert strip.min() < 128


def test_single_image_and_pil_list():
    one = make_grid(torch.zeros(1, 8, 8, 3, dtype=torch.uint8), nrow=4, padding=2, min_tile_size=0)
    assert one.size == (12, 12)  # one column only, not four
    pil = [Image.new("RGB", (8, 6), (i * 40, 0, 0)) for i in range(3)]
    assert make_grid(pil, nrow=2, padding=0, min_tile_size=0).size == (16, 12)
    gray = make_grid(np.zeros((2, 4, 4, 1), np.uint8), nrow=2, padding=0, min_tile_size=0)
    assert gray.size == (8, 4)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="uint8"):
        make_grid(torch.zeros(2, 8, 8, 3), nrow=2)  # float
    with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):
        make_grid(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), nrow=2)  # channels first
    with pytest.raises(ValueError, match="2 captions for 3 images"):
        make_grid(torch.zeros(3, 4, 4, 3, dtype=torch.uint8), nrow=2, captions=["a", "b"])
    with pytest.raises(ValueError, match="one size"):
        make_grid([Image.new("RGB", (4, 4)), Image.new("RGB", (5, 4))], nrow=2)
    with pytest.raises(ValueError, match="nrow"):
        make_grid(torch.zeros(1, 4, 4, 3, dtype=torch.uint8), nrow=0)


def test_save_grid_writes_png(tmp_path):
    path = save_grid(torch.zeros(5, 16, 20, 3, dtype=torch.uint8), tmp_path / "g" / "step_1.png", 3, ["a"] * 5, min_tile_size=0)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width == 76
    assert [p.name for p in (tmp_path / "g").iterdir()] == ["step_1.png"]


def test_small_tiles_are_enlarged_exactly():
    images = torch.arange(2 * 4 * 4 * 3, dtype=torch.uint8).reshape(2, 4, 4, 3)
    grid = make_grid(images, nrow=2, padding=0, min_tile_size=16)
    # 4 px tiles enlarged 4x with nearest sampling: each source pixel becomes a 4x4 block.
    assert grid.size == (32, 16)
    pixels = np.asarray(grid)
    assert (pixels[0:4, 0:4] == images[0, 0, 0].numpy()).all()
    assert (pixels[12:16, 28:32] == images[1, 3, 3].numpy()).all()


def test_marks_frame_right_tiles_green_and_wrong_tiles_red():
    images = torch.full((3, 8, 8, 3), 128, dtype=torch.uint8)
    grid = np.asarray(make_grid(images, nrow=3, padding=4, min_tile_size=0, marks=[True, False, None]))
    # tile k spans x = 4 + 12 k .. 11 + 12 k; its frame is the 2 pixels (half the padding) around it
    assert tuple(grid[8, 2]) == tuple(grid[8, 13]) == (0, 170, 0)
    assert tuple(grid[8, 14]) == tuple(grid[8, 25]) == (220, 0, 0)
    assert tuple(grid[8, 1]) == tuple(grid[8, 26]) == (255, 255, 255)  # outside the frames; tile 2 has none
    assert (grid[4:12, 4:12] == 128).all()  # the frame never covers the image
    with pytest.raises(ValueError, match="2 marks for 3 images"):
        make_grid(images, nrow=3, marks=[True, False])
