"""Turning whatever image a user's data holds into the 8-bit RGB picture every processor expects."""

from __future__ import annotations

import logging

import numpy as np
from PIL import ExifTags, Image, ImageOps

log = logging.getLogger(__name__)
DEFAULT_MAX_PIXELS = 4096 * 4096  # larger images are scaled down before the processor sees them
_capped_logged: set[tuple[int, int]] = set()


class BadImage(ValueError):
    """An image that cannot be used (empty, undecodable); the caller adds which row and field."""


# Deep grayscale modes and the factor that maps their declared range onto 0..255 (never each image's own min-max:
# a uniform white 16-bit image stays white). PIL opens 16-bit PNG and TIFF as I;16*; 32-bit I holding only 16-bit
# values is the same data in the wider mode (older Pillow, some TIFF writers).
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I;16S")


def _deep_to_8bit(img: Image.Image) -> np.ndarray:
    """8-bit levels of a deep grayscale image, by its declared bit depth: 16-bit / 257 (65535 -> 255), 32-bit
    integers over their signed range, float images as 0..1 (values outside it clipped, NaN black)."""
    values = np.asarray(img, dtype=np.float64)
    if img.mode == "F":
        return np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=0.0).clip(0.0, 1.0) * 255.0
    if img.mode in _SIXTEEN_BIT or (values.size and values.min() >= 0 and values.max() <= 65535):
        return values.clip(0, 65535) / 257.0
    return (values + 2.0 ** 31) / (2.0 ** 32 - 1) * 255.0


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB. Transparency is composited on white; 16/32-bit and float images are converted by their declared
    bit depth (16-bit: divide by 257), never stretched to the image's own contrast."""
    if img.width == 0 or img.height == 0:
        raise BadImage(f"has zero size ({img.width}x{img.height})")
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT + ("I", "F"):
        return Image.fromarray(_deep_to_8bit(img).round().astype(np.uint8), mode="L").convert("RGB")
    if img.mode == "P" or img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV


def cap_pixels(img: Image.Image, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Scale an image above `max_pixels` down to it (aspect kept); the first time per size is logged."""
    pixels = img.width * img.height
    if pixels <= max_pixels:
        return img
    scale = (max_pixels / pixels) ** 0.5
    size = (max(1, int(img.width * scale)), max(1, int(img.height * scale)))
    if img.size not in _capped_logged:
        _capped_logged.add(img.size)
        log.warning("image of %dx%d px scaled to %dx%d (max_pixels %d)", img.width, img.height, *size, max_pixels)
    return img.resize(size, Image.BILINEAR)


def upright(img: Image.Image) -> Image.Image:
    """The image as it is meant to be seen: an EXIF orientation tag (a phone photo taken sideways) applied, as
    datasets' Image feature and transformers' load_image do, so a caption's "above" is above in what the model sees."""
    if img.getexif().get(ExifTags.Base.Orientation, 1) != 1:
        return ImageOps.exif_transpose(img)
    return img


def prepare(img: Image.Image, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode fully (a truncated file fails here, not inside the model), turn upright, convert, cap."""
    try:
        img.load()
        img = upright(img)
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError... for bad data
        raise BadImage(f"cannot be decoded: {err}") from None
    return cap_pixels(to_rgb(img), max_pixels)


def prepare_sample_image(img: Image.Image, sample: int) -> Image.Image:
    """`prepare` for the images of prompt `sample`; a bad image names its sample."""
    try:
        return prepare(img)
    except BadImage as err:
        raise ValueError(f"sample {sample}: field 'images': the image {err}") from None
