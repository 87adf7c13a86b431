"""Image files decoded as a model reads them: RGB, a fixed square size (the whole image
squashed, or a centre crop as pretrained models were evaluated), floats in [0, 1]."""

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
            image = image.convert("RGB")
            if crop_pct is None:
                image = image.resize((size, size), resample)
            else:
                image = centre_crop(image, size, crop_pct, resample)
            pixels = np.array(image)  # (S, S, 3) uint8, a writable copy
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        # Pillow's "cannot identify image file '<path>'" would name the path twice.
        unknown = isinstance(exc, Image.UnidentifiedImageError)
        reason = "not an image format Pillow reads" if unknown else first_line(exc, 80)
        raise ConfigError(
            f"image file {str(path)!r} cannot be decoded ({reason}); remove or replace it"
        ) from None
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255)


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
