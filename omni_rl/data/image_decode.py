"""Decoding a dataset's images, with a cap on their pixels.

`decode_image(data, where, source)` checks the header's size against `MAX_IMAGE_PIXELS` before
decoding (decompression bombs) and decodes to RGB, raising one `PromptFileError` on failure;
`pixel_digest(image)` identifies a picture whatever file it came from.
"""
from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from omni_rl.data.prompt_item import PromptFileError

# 8192 x 8192: larger than any model here generates or edits, and 200 MB decoded as RGB.
MAX_IMAGE_PIXELS = 8192 * 8192


def decode_image(data: bytes | Path, where: str, source: str) -> Image.Image:
    """`data` (encoded bytes, or a file to read) -> a fully decoded RGB image; see the docstring."""
    try:
        with warnings.catch_warnings():
            # PIL warns (then raises) on its own, larger bound; ours is checked first, below.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise _over_cap(where, source, width, height)
                image.load()
                return _to_rgb(image)
    except PromptFileError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise PromptFileError(
            f"{where}: {source} states more pixels than the cap of {MAX_IMAGE_PIXELS:,} ({err}); downscale it "
            f"(at most 8192 x 8192)"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise PromptFileError(
            f"{where}: {source} is not a readable image ({type(err).__name__}: {err}); replace or "
            f"re-encode it (PNG, JPEG, WebP, ...)"
        ) from None


def pixel_digest(image: Image.Image) -> str:
    """A digest of `image`'s mode, size and decoded pixels."""
    digest = hashlib.sha256(f"{image.mode} {image.size}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def _over_cap(where: str, source: str, width: int, height: int) -> PromptFileError:
    return PromptFileError(
        f"{where}: {source} is {width} x {height} = {width * height:,} pixels, over the cap of "
        f"{MAX_IMAGE_PIXELS:,} (8192 x 8192); downscale it"
    )


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "RGBa", "La", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB") if image.mode != "RGB" else image.copy()
