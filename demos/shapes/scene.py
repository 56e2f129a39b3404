"""Synthetic scenes of flat shapes, and their renderer.

A `Scene` is one to four `Shape`s (circle, square or triangle, in one of `COLOURS`) on a plain
`BACKGROUND`. Geometry is in units of the image side, so one scene renders at any pixel size
(`render(scene, size)`; 32..128 px are tested, 64 px is the default): a shape is given by its
centre (cx, cy) in [0, 1] (x to the right, y downwards) and its half-extent r, the half side of
its bounding box. The drawing is binary (no anti-aliasing): a pixel takes a shape's colour when
its centre lies inside the shape, so every pixel is exactly the background or a palette colour
and a detector can segment the image by colour.

    circle    (x - cx)^2 + (y - cy)^2 <= r^2                        fills pi/4 of its box
    square    |x - cx| <= r and |y - cy| <= r                       fills all of it
    triangle  upright, apex (cx, cy - r), base y = cy + r from cx - r to cx + r: fills half

Shapes are drawn in order (a later one covers an earlier one); the layouts of
`demos.shapes.sampling` never overlap them. Not here: captions (`grammar`), layouts
(`sampling`), detection (`demos.shapes.reward`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES = ("circle", "square", "triangle")
# Saturated primaries far apart in RGB, so a blurred generator's output still clusters.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 40),
}
BACKGROUND = (200, 200, 200)  # light grey
DEFAULT_SIZE = 64


@dataclass(frozen=True)
class Shape:
    """One shape: `shape` in SHAPES, `colour` in COLOURS, centre (cx, cy) and half-extent r in
    units of the image side."""

    shape: str
    colour: str
    cx: float
    cy: float
    r: float

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape={self.shape!r}; expected one of {', '.join(SHAPES)}")
        if self.colour not in COLOURS:
            raise ValueError(f"colour={self.colour!r}; expected one of {', '.join(COLOURS)}")
        if not (0 < self.r <= 0.5):
            raise ValueError(f"r={self.r!r}; expected a half-extent in (0, 0.5] of the image side")

    @property
    def box(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1), the bounding box in units of the image side."""
        return (self.cx - self.r, self.cy - self.r, self.cx + self.r, self.cy + self.r)


@dataclass(frozen=True)
class Scene:
    """The shapes of one image, drawn in order on `background`."""

    shapes: tuple[Shape, ...]
    background: tuple[int, int, int] = BACKGROUND


def shape_mask(shape: Shape, size: int) -> np.ndarray:
    """[size, size] bool: the pixels whose centres lie inside `shape`."""
    centres = (np.arange(size, dtype=np.float64) + 0.5) / size
    y, x = centres[:, None], centres[None, :]
    dx, dy = x - shape.cx, y - shape.cy
    r = shape.r
    if shape.shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape.shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    # Upright triangle: at depth d = dy + r below the apex the half-width is d / 2.
    depth = dy + r
    return (depth >= 0) & (depth <= 2 * r) & (np.abs(dx) <= depth / 2)


def render(scene: Scene, size: int = DEFAULT_SIZE) -> np.ndarray:
    """The scene as uint8 RGB [size, size, 3]."""
    if not isinstance(size, int) or size < 8:
        raise ValueError(f"size={size!r}; expected an image side of at least 8 pixels (32..128 are tested)")
    image = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = scene.background
    for shape in scene.shapes:
        image[shape_mask(shape, size)] = COLOURS[shape.colour]
    return image
