"""Image files decoded as a model reads them: RGB, a fixed square size (the whole image
squashed, or a centre crop as pretrained models were evaluated), floats in [0, 1].

Every mode Pillow reads is scaled by its own range, never clipped: 8-bit modes (L, P, RGB,
CMYK, 1, ...) by 255 after Pillow's conversion to RGB (alpha dropped, as torchvision and
timm read images); one-channel 16-bit modes (I;16, a 16-bit PNG or TIFF scan) and 32-bit
integers (I) by 65535, grey in all three channels; 32-bit floats (F) as they are. A value
outside that range (a negative I, an F above 1) is refused naming the file: its scale is
not known. Pillow's own conversion to RGB clips 16-bit values at 255 (an all-white image)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, first_line


def pillow():
    """Pillow, an optional dependency: only image folders need it."""
    try:
        import PIL.Image
    except ImportError:
        raise ConfigError(
            "data.name=image_folder needs Pillow: pip install pillow (or pip install -e "
            "'.[images]')"
        ) from None
    return PIL.Image


def decode(
    path: Path, size: int, crop_pct: float | None = None, interpolation: str = "bilinear"
) -> torch.Tensor:
    """The image at `path` as RGB floats in [0, 1], (3, size, size): the whole image squashed
    to the square, or (crop_pct) its short side resized to size / crop_pct and the centre
    square cut out, as torchvision's and timm's evaluation transforms do."""
    Image = pillow()
    resample = getattr(Image.Resampling, interpolation.upper())
    try:
        with Image.open(path) as image:
            image, scale = _scaled(image, path, Image)
            if crop_pct is None:
                image = image.resize((size, size), resample)
            else:
                image = centre_crop(image, size, crop_pct, resample)
            pixels = np.array(image, dtype=np.float32)  # (S, S, 3) or one channel (S, S)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        # Pillow's "cannot identify image file '<path>'" would name the path twice.
        unknown = isinstance(exc, Image.UnidentifiedImageError)
        reason = "not an image format Pillow reads" if unknown else first_line(exc, 80)
        raise ConfigError(
            f"image file {str(path)!r} cannot be decoded ({reason}); remove or replace it"
        ) from None
    if pixels.ndim == 2:  # one 16- or 32-bit channel: grey
        pixels = np.repeat(pixels[:, :, None], 3, axis=2)
    return torch.from_numpy(pixels).permute(2, 0, 1).div_(scale)


WIDE = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # one channel of 16 (or 32) bit integers


def _scaled(image, path: Path, Image):
    """(an image Pillow resizes without losing range, the value of full intensity)."""
    if image.mode in WIDE:
        values = np.asarray(image).astype(np.float32)
        if values.size and (values.min() < 0 or values.max() > 65535):
            _refuse(path, image.mode, f"values {values.min():g} to {values.max():g}, not 0-65535")
        return Image.fromarray(values, mode="F"), 65535.0
    if image.mode == "F":
        values = np.asarray(image)
        inside = np.isfinite(values).all() and 0 <= values.min() <= values.max() <= 1
        if values.size and not inside:
            _refuse(path, image.mode, f"values {values.min():g} to {values.max():g}, not 0-1")
        return image, 1.0
    return image.convert("RGB"), 255.0


def _refuse(path: Path, mode: str, why: str):
    raise ConfigError(
        f"image file {str(path)!r} (mode {mode}) holds {why}, so its brightness scale is not "
        "known; save it as 8- or 16-bit (or floats in [0, 1])"
    )


def centre_crop(image, size: int, crop_pct: float, resample):
    """The short side resized to floor(size / crop_pct), the long one in proportion, then the
    centre size x size: the arithmetic of timm's and torchvision's evaluation transforms
    (Resize(int) truncates the long side; center_crop rounds the offsets), to the pixel."""
    short = math.floor(size / crop_pct + 1e-9)  # 224 / 0.875 is 256, not 255.99...
    w, h = image.size
    w, h = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize((max(w, size), max(h, size)), resample)
    left, top = (int(round((side - size) / 2.0)) for side in image.size)
    return image.crop((left, top, left + size, top + size))
