"""Images in one folder per class, decoded with Pillow as they are read (in the loader workers).

    data/pets/cat/001.png             data/pets/train/cat/001.png
    data/pets/dog/002.jpg      or     data/pets/val/cat/101.jpg
    ...                               ...

    data:
      name: image_folder
      root: data/pets
      num_workers: 2          # files are decoded per sample: worker processes pay off here

Without train/ and val/ sub-folders, data.val_fraction of the images (of each class)
validates. Class ids follow the sorted folder names of the training part; val/ may lack a
class but not add one. Files ending in .png, .jpg, .jpeg, .bmp or .webp count (any case, in
sub-folders too); other files are ignored. Every image becomes RGB, image_size x image_size,
scaled to [0, 1] and normalised with mean and std; these and the class names travel in every
checkpoint (`meta`), so evaluation and prediction read new images the same way.

# >>> multilabel
Multi-label (task.name=multilabel): `labels: data/photos/labels.csv`, a CSV of `file,labels`
rows (the file relative to root, its labels joined by label_sep), names the images and their
labels; data.val_fraction of them validates.

# <<< multilabel

Training samples are augmented (augment: true), the held-out part of a pool is not: a random
shift (reflect-pad, then crop back) and, with hflip, a random mirror image, drawn from a seed
the training sampler sends with each index, a function of (run.seed, epoch, sample): a sample
is augmented the same way whichever worker reads it, and a resumed run draws as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..errors import ConfigError
from .image_decode import decode, pillow
from .label_sets import image_labels  # feature: multilabel

# How images are read for models trained here (the options' auto without a pretrained model).
OWN = {"image_size": 32, "interpolation": "bilinear", "mean": "0.5", "std": "0.5"}
EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}
LAYOUT = "root/<class>/*.png, or root/train/<class>/ and root/val/<class>/"


@dataclass
class Options:
    root: str = "data/images"  # class folders, or train/ and val/ folders of class folders
    # Every image becomes image_size x image_size. auto (0, "auto") takes a pretrained model's
    # own preprocessing (model.name=timm or torchvision: e.g. 224, crop 0.875, bilinear,  # feature: pretrained
    # ImageNet's mean and std), else 32 px, the whole image squashed, bilinear, mean/std 0.5.  # feature: pretrained
    # own preprocessing (a model with `preprocessing`: e.g. 224, crop 0.875, bilinear,  # feature: !pretrained
    # ImageNet's mean and std), else 32 px, the whole image squashed, bilinear, mean/std 0.5.  # feature: !pretrained
    image_size: int = 0
    # In (0, 1]: resize the short side to image_size / crop_pct, then take the centre square;
    # 0 = auto (the model's, or the whole image squashed to the square)
    crop_pct: float = 0.0
    interpolation: Literal["auto", "bilinear", "bicubic", "nearest"] = "auto"
    # Random shifts (and flips, below) of the training images. They cost loader throughput
    # (docs/data.md: Image folders): data.augment=false when the loader is what limits training.
    augment: bool = True
    hflip: bool = True  # augment with mirror images too; off when left/right matters (text)
    # Per channel (R,G,B), or one number for all three; auto: the pretrained model's, else 0.5
    # (which maps [0, 1] to [-1, 1]: for models trained from scratch, centring is enough)
    mean: str = "auto"
    std: str = "auto"
    # Held-out test images in class folders, never trained on nor used to choose best.pt;
    # "" = root/test when it exists (so no class may be named "test")
    test_root: str = ""
    # >>> multilabel
    # Multi-label: a CSV of file,labels rows (labels joined by label_sep); "" = class folders
    labels: str = ""
    label_sep: str = "|"
    # <<< multilabel

    def checks(self):
        mean, std = _per_channel(self.mean), _per_channel(self.std)
        return [
            ("image_size", self.image_size == 0 or self.image_size >= 4, ">= 4, or 0 (auto)"),
            ("crop_pct", 0 <= self.crop_pct <= 1, "in (0, 1], or 0 (auto)"),
            ("mean", mean is not None, "3 comma-separated numbers (R,G,B) or one number"),
            ("std", std is not None and min(std) > 0, "3 numbers > 0 (R,G,B) or one"),
            ("label_sep", bool(self.label_sep.strip()), "one or more characters"),  # feature: multilabel
        ]


class ImageFolder(Dataset):
    Options = Options
    seeded_items = True  # training items come as (index, seed): augmentation draws from seed

    @staticmethod
    def has_val_split(opts: Options) -> bool:
        root = Path(opts.root)
        return not opts.labels and (root / "train").is_dir() and (root / "val").is_dir()  # feature: multilabel
        return (root / "train").is_dir() and (root / "val").is_dir()  # feature: !multilabel

    @staticmethod
    def from_model(opts: Options, prep: dict) -> Options:
        """`opts` with what is left at auto taken from a pretrained model's preprocessing
        (models.preprocessing: image_size, crop_pct, interpolation, mean, std)."""
        auto = {k: v for k, v in prep.items() if getattr(opts, k, None) in (0, "auto")}
        for key in ("mean", "std"):
            if key in auto:
                auto[key] = ",".join(f"{v:g}" for v in auto[key])
        return replace(opts, **auto)

    test_option = "test_root"  # the option evaluate.py --data sets (data.build_test_set)

    @staticmethod
    def has_test_split(opts: Options) -> bool:
        return not opts.labels and (bool(opts.test_root) or (Path(opts.root) / "test").is_dir())  # feature: multilabel
        return bool(opts.test_root) or (Path(opts.root) / "test").is_dir()  # feature: !multilabel

    def __init__(self, opts: Options, split: str):
        pillow()  # missing: one line now, not an error in every loader worker later
        self.opts = opts
        root = Path(opts.root)
        self.classes = self.num_classes = self.num_labels = self.label_names = None
        # >>> multilabel
        if opts.labels:  # multi-label: the files and labels its CSV names
            self.files, self.y, self.label_names = image_labels(
                root, Path(opts.labels), opts.label_sep
            )
            self.num_labels, self.path = len(self.label_names), root
            self._finish(opts, split)
            return
        # <<< multilabel
        halves = [name for name in ("train", "val") if (root / name).is_dir()]
        if len(halves) == 1:  # a split folder without its other half: not a class folder
            other = "val" if halves == ["train"] else "train"
            raise ConfigError(
                f"image folder {str(root / halves[0])!r} has no {other}/ folder beside it; add "
                f"{str(root / other)!r}, or put the class folders directly in {str(root)!r}"
            )
        own_val = self.has_val_split(opts)
        train_dir = root / "train" if own_val else root
        self.classes = class_names(train_dir, skip="" if own_val else "test")
        folder = {"val": root / "val", "test": Path(opts.test_root or root / "test")}
        self.path = folder = folder.get(split, train_dir)
        held_out = split in ("val", "test")  # may lack a class, not add one
        skip = "test" if folder == root else ""  # one pool's test/ holds no class
        self.files, labels = find_images(folder, self.classes, not held_out, skip)
        self.y = torch.tensor(labels, dtype=torch.int64)  # stratifies the held-out split
        self.num_classes = len(self.classes)
        self._finish(opts, split)

    def _finish(self, opts: Options, split: str) -> None:
        # Which samples are augmented: the training rows, which prepare() is told.
        self.augmented = torch.full((len(self.files),), opts.augment and split == "train")
        self.size = opts.image_size or OWN["image_size"]
        self.crop_pct = opts.crop_pct or None  # None: squash the whole image
        auto = opts.interpolation == "auto"
        self.interpolation = OWN["interpolation"] if auto else opts.interpolation
        self.mean = torch.tensor(_per_channel(opts.mean)).view(3, 1, 1)
        self.std = torch.tensor(_per_channel(opts.std)).view(3, 1, 1)
        self.meta = self._meta()

    def _meta(self) -> dict:
        return {
            "classes": self.classes,
            **({"labels": self.label_names} if self.label_names is not None else {}),  # feature: multilabel
            "image_size": self.size,
            "crop_pct": self.crop_pct,
            "interpolation": self.interpolation,
            "mean": self.mean.flatten().tolist(),
            "std": self.std.flatten().tolist(),
        }

    def prepare(self, indices, meta: dict | None) -> dict:
        """Augment the training rows `indices` only: the held-out rows of one pool are read as
        evaluation reads them. Nothing is learnt from the images; a checkpoint's `meta` is
        applied, so they are read as the model was trained on them."""
        self.augmented = torch.zeros(len(self.files), dtype=torch.bool)
        if indices is not None and self.opts.augment:
            self.augmented[torch.as_tensor(list(indices), dtype=torch.int64)] = True
        if meta is not None:
            if (meta.get("classes"), meta.get("labels")) != (self.classes, self.label_names):  # feature: multilabel
            if meta.get("classes") != self.classes:  # feature: !multilabel
                raise ConfigError(
                    f"image folder {self.opts.root!r} has the classes {self.classes}, the "
                    f"training run had {meta.get('classes')}; evaluate on the same classes"
                )
            self.size = meta["image_size"]
            self.crop_pct = meta.get("crop_pct")  # checkpoints before it: squashed, bilinear
            self.interpolation = meta.get("interpolation", "bilinear")
            self.mean = torch.tensor(meta["mean"]).view(3, 1, 1)
            self.std = torch.tensor(meta["std"]).view(3, 1, 1)
            self.meta = self._meta()
        return self.meta

    def __len__(self) -> int:
        return len(self.files)

    def sample_bytes(self) -> int:
        """Memory one decoded sample takes: float32 (3, size, size), and the decode's copy."""
        return 2 * 3 * self.size * self.size * 4

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        # (index, seed) from the training loader: the augmentation depends on the seed alone.
        i, seed = item if isinstance(item, tuple) else (item, None)
        x = decode(self.files[i], self.size, self.crop_pct, self.interpolation)  # (3, S, S)
        if self.augmented[i]:
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            x = self._augment(x, g)
        return (x - self.mean) / self.std, self.y[i]

    def _augment(self, x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        # A shift of up to 1/8 of the side: reflect-pad, then crop a random window back.
        pad = max(1, self.size // 8)
        padded = F.pad(x[None], (pad, pad, pad, pad), mode="reflect")[0]
        top, left = torch.randint(2 * pad + 1, (2,), generator=g).tolist()
        x = padded[:, top : top + self.size, left : left + self.size]
        if self.opts.hflip and torch.rand((), generator=g) < 0.5:
            x = x.flip(-1)
        return x.contiguous()


def class_names(folder: Path, skip: str = "") -> list[str]:
    """The sorted sub-folder names of `folder` but `skip` (a test/ folder beside the class
    folders of one pool): the classes."""
    if not folder.is_dir():
        raise ConfigError(
            f"image folder {str(folder)!r} not found; set data.root to a folder laid out as "
            f"{LAYOUT}"
        )
    names = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != skip
    )
    if len(names) < 2:
        raise ConfigError(
            f"image folder {str(folder)!r} has {len(names)} class sub-folders; a classifier "
            f"needs at least 2, laid out as {LAYOUT}"
        )
    return names


def find_images(folder: Path, classes: list[str], must_have_all: bool, skip: str = ""):
    """(files, class ids) under folder/<class>/, in sorted order. Training folders need
    images in every class; a val/ folder may lack classes, but not add any."""
    if not folder.is_dir():
        raise ConfigError(f"image folder {str(folder)!r} not found; expected {LAYOUT}")
    present = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != skip
    )
    extra = [name for name in present if name not in classes]
    if extra:
        raise ConfigError(
            f"image folder {str(folder / extra[0])!r} is a class the model was not trained "
            f"on (its classes: {', '.join(classes)}); held-out classes must be training ones"
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(
            p
            for p in (folder / name).rglob("*")
            if p.suffix.lower() in EXTENSIONS and not p.name.startswith(".") and p.is_file()
        )
        if not found and (must_have_all or name in present):
            raise ConfigError(
                f"image folder {str(folder / name)!r} holds no images "
                f"({', '.join(sorted(EXTENSIONS))}); add some or remove the folder"
            )
        files += found
        labels += [label] * len(found)
    if not files:
        raise ConfigError(f"image folder {str(folder)!r} holds no images; expected {LAYOUT}")
    return files, labels


def _per_channel(text: str) -> list[float] | None:
    """'0.5' or '0.5,0.4,0.3' as three numbers ("auto": OWN's), or None when it is neither."""
    text = OWN["mean"] if text == "auto" else text  # OWN's mean and std are one number
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        return None
    return values * 3 if len(values) == 1 else values if len(values) == 3 else None
