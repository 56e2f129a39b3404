"""JPEG (in)compressibility rewards (DDPO, Black et al. 2023; also used by Flow-GRPO).

    jpeg_compressibility   = -scale * size_kB    (of a quality-95 JPEG encoded in memory by PIL)
    jpeg_incompressibility = +scale * size_kB

`scale` 1.0 gives DDPO's kB; Flow-GRPO trains on size / 500, `scale=0.002`. `quality` is the
JPEG quality (95). Images are encoded as RGB, so a PIL list and the equal tensor score alike.
"""
from __future__ import annotations

import io
import math
import numbers
from typing import Any, Sequence

from PIL import Image

from omni_rl.reward import Images, check_batch, register_reward, to_pil_list


def jpeg_size_kb(image: Image.Image, quality: int = 95) -> float:
    """Size in kB (bytes / 1000) of `image` encoded as a JPEG of the given quality."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return len(buffer.getvalue()) / 1000.0


class JpegSizeScorer:
    """Scores each image by `sign * scale * jpeg_size_kb(image, quality)`."""

    def __init__(self, reward_name: str, sign: float, scale: float, quality: int):
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(
                f"{reward_name}: scale={scale!r}; expected a finite number > 0 (0.002 gives "
                f"Flow-GRPO's size/500). To flip the sign use the other jpeg reward"
            )
        if isinstance(quality, bool) or not isinstance(quality, numbers.Integral) or not 1 <= quality <= 100:
            raise ValueError(f"{reward_name}: quality={quality!r}; expected an int in 1..100 (DDPO uses 95)")
        self.reward_name = reward_name
        self.factor = sign * float(scale)
        self.quality = int(quality)

    def __call__(self, images: Images, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(images, prompts, metadata)
        return [self.factor * jpeg_size_kb(image, self.quality) for image in to_pil_list(images)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reward_name}, factor={self.factor:g}, quality={self.quality})"


@register_reward("jpeg_compressibility")
def jpeg_compressibility(*, scale: float = 1.0, quality: int = 95) -> JpegSizeScorer:
    """Minus the JPEG size in kB, times `scale`: rewards images that compress well."""
    return JpegSizeScorer("jpeg_compressibility", -1.0, scale, quality)


@register_reward("jpeg_incompressibility")
def jpeg_incompressibility(*, scale: float = 1.0, quality: int = 95) -> JpegSizeScorer:
    """The JPEG size in kB, times `scale`: rewards images that compress badly (detailed ones)."""
    return JpegSizeScorer("jpeg_incompressibility", 1.0, scale, quality)
