"""predict.py's image inputs: image files, and folders of them, each read by the training
dataset's own decode() with the preprocessing the checkpoint's data meta saved."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.image_folder import EXTENSIONS, decode
from ..errors import ConfigError
from .inference import Trained


def is_image(path: Path) -> bool:
    """Whether `path` is named as the files image folders train on (.png, .jpg, ...)."""
    return path.suffix.lower() in EXTENSIONS


def images_in(folder: Path) -> list[Path]:
    """The image files under `folder` (sub-folders too), sorted; refused when there are none."""
    found = sorted(path for path in folder.rglob("*") if is_image(path))
    if not found:
        raise ConfigError(
            f"folder {str(folder)!r} holds no image files ({', '.join(sorted(EXTENSIONS))})"
        )
    return found


def read_images(paths: list[Path], trained: Trained) -> tuple[list[str], torch.Tensor, list]:
    """(ids, images (N, C, S, S), labels): each image read by the training dataset's own
    decode(); its label is the name of its folder where that is one of the classes."""
    meta = trained.meta
    size = meta.get("image_size")
    if not size or "mean" not in meta:
        raise ConfigError(
            f"image file {str(paths[0])!r}: checkpoint {trained.path!r} was not trained on "
            "image files (its data meta has no image_size, mean and std); give it inputs like "
            "its training data"
        )
    mean = torch.tensor(meta["mean"]).view(-1, 1, 1)
    std = torch.tensor(meta["std"]).view(-1, 1, 1)
    view = (meta.get("crop_pct"), meta.get("interpolation", "bilinear"))  # as trained
    images = [(decode(path, size, *view) - mean) / std for path in paths]  # (3, S, S) each
    classes = set(trained.classes or ())
    labels = [p.parent.name if p.parent.name in classes else "" for p in paths]
    return [str(p) for p in paths], torch.stack(images), labels if classes else None
