"""One image file to the pixels prepare stores: Pillow's decode, EXIF orientation applied,
converted to RGB, resized so that its shorter side is the storage size (aspect ratio kept).

What runs in prepare's worker processes: numpy and Pillow only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# Pillow refuses images over ~179M pixels as a possible decompression bomb; a photograph is
# far below, a file that claims more is refused as an unreadable image.
Image.MAX_IMAGE_PIXELS = 1 << 28


class BadImage(ValueError):
    """An image file Pillow cannot decode whole (truncated, corrupt, not an image)."""


def decode_image(path: Path, shorter_side: int) -> np.ndarray:
    """The pixels of `path` as uint8 `[height, width, 3]` (RGB), `min(height, width) ==
    shorter_side`, the aspect ratio kept (the longer side rounded).

    The camera's EXIF orientation is applied (a portrait photo stored sideways comes out
    upright); grayscale, palette and CMYK images are converted to RGB, and transparent pixels
    are composited over white (what a viewer shows). Downscaling uses Pillow's BICUBIC filter
    with `reducing_gap` (antialiased), after a JPEG's own DCT scaling (`Image.draft`) where the
    file is at least twice the size asked for.

    Raises:
        BadImage: the file is not an image Pillow reads, or is truncated or corrupt.
    """
    try:
        with Image.open(path) as image:
            image.draft("RGB", (shorter_side, shorter_side))  # JPEG only; others ignore it
            image.load()  # decodes now: a truncated file fails here, not later
            image = ImageOps.exif_transpose(image)
            rgb = to_rgb(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise BadImage(f"{path}: {error}") from None
    width, height = rgb.size
    scale = shorter_side / min(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return np.array(rgb, dtype=np.uint8)  # writable, its own memory


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in mode RGB; an alpha channel (or a palette's transparent colour) composited
    over white."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
