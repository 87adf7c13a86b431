"""Your own arrays as tensor files: <data.root>/train.pt and (optionally) val.pt, each
{"x": (N, ...), "y": (N, ...)}. Without val.pt, data.val_fraction of train.pt validates.

Make them once from whatever arrays you have, e.g.
    x, y = torch.from_numpy(images).float(), torch.from_numpy(labels).long()
    torch.save({"x": x, "y": y}, "data/train.pt")

Checked at load, each problem reported on one line: x is a floating-point tensor of at least
2 dims (float64 and float16 are converted to float32; integer images are refused, since their
scale is unknown: convert them, e.g. x.float() / 255), or int64 token ids (N, T) with y the  # feature: text
same shape (language modelling). y holds N integer class ids 0..K-1 (classification; K counts  # feature: text
the classes of train.pt) or floats (N,) / (N, K) (regression: their training rows' mean and std  # feature: text
scale is unknown: convert them, e.g. x.float() / 255). y holds N integer class ids 0..K-1  # feature: !text
(classification; K counts the classes of train.pt) or floats (N,) / (N, K) (regression: their  # feature: !text
training rows' mean and std  # feature: !text
go into the data meta, and the task learns them standardised). val.pt has the same sample
shape. Grayscale images (N, H, W) get a channel dim, (N, 1, H, W), so the cnn can run on them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError  # feature: text
from ..errors import ConfigError, left_out  # feature: !text
from .in_memory import InMemoryDataset

FORMAT = '{"x": float tensor (N, ...), "y": int64 class ids (N,) or float targets (N,) / (N, K)}'


@dataclass
class Options:
    root: str = "data"  # folder holding train.pt and, optionally, val.pt


class TensorFiles(InMemoryDataset):
    Options = Options

    @staticmethod
    def has_val_split(opts: Options) -> bool:
        return (Path(opts.root) / "val.pt").is_file()

    def __init__(self, opts: Options, split: str):
        name = "val" if split == "val" else "train"
        path = Path(opts.root) / f"{name}.pt"
        self.x, self.y = _load(path, opts.root, name)
        self.num_classes = self.num_targets = self.vocab_size = None
        if self.y.dtype.is_floating_point:  # regression targets
            self.num_targets = self.y[0].numel()
        # >>> text
        elif self.y.shape == self.x.shape:  # token ids in and out: language modelling
            self.vocab_size = int(max(self.x.max(), self.y.max())) + 1
            _check_count(path, "token", self.vocab_size, self.x.numel())
        # <<< text
        else:
            self.num_classes = int(self.y.max()) + 1
            _check_count(path, "class", self.num_classes, len(self.y))
            if self.num_classes < 2 and name == "train":
                _refuse(path, "y holds class 0 only; a classifier needs at least 2 classes")
        if name == "train":
            return
        # Classes and sample shape come from train.pt, so that train and val agree.
        train = TensorFiles(opts, "train")
        if self.x.shape[1:] != train.x.shape[1:]:
            _refuse(
                path,
                f"samples are {tuple(self.x.shape[1:])}, but "
                f"{tuple(train.x.shape[1:])} in train.pt",
            )
        if self.y.dtype != train.y.dtype or self.y.shape[1:] != train.y.shape[1:]:
            _refuse(
                path,
                f"y is {self.y.dtype} of sample shape {tuple(self.y.shape[1:])}, but "
                f"{train.y.dtype} of {tuple(train.y.shape[1:])} in train.pt",
            )
        if self.num_classes is not None and self.num_classes > (train.num_classes or 0):
            _refuse(
                path,
                f"y holds class {int(self.y.max())}, but train.pt has classes "
                f"0..{(train.num_classes or 1) - 1} only",
            )
        # >>> text
        if self.vocab_size is not None and self.vocab_size > train.vocab_size:
            _refuse(
                path,
                f"it holds token {self.vocab_size - 1}, but train.pt has tokens "
                f"0..{train.vocab_size - 1} only (the model's vocabulary)",
            )
        # <<< text
        self.num_classes, self.num_targets = train.num_classes, train.num_targets
        self.vocab_size = train.vocab_size


def _load(path: Path, root: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not path.is_file():
        raise ConfigError(
            f"data file {str(path)!r} not found; put {split}.pt in data.root={root!r} "
            "(see data/tensor_files.py) or use data.name=synthetic"
        )
    with path.open("rb") as f:
        magic = f.read(2)
    if magic not in (b"PK", b"\x80\x02"):  # torch.save's zip archive, or its legacy pickle
        _refuse(path, "it is not a file written by torch.save")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower():
            _refuse(path, "it holds pickled Python objects, which are not loaded (code could run)")
        _refuse(path, "it is not a file written by torch.save")
    except OSError:
        raise  # unreadable (permissions): the entry point names the path and the fix
    except Exception:  # not a zip archive, truncated, or text: each fails differently
        _refuse(path, "it is not a file written by torch.save, or it is truncated")
    if not isinstance(blob, dict) or not {"x", "y"} <= blob.keys():
        keys = sorted(map(str, blob)) if isinstance(blob, dict) else type(blob).__name__
        _refuse(path, f"it holds {keys}, not the keys 'x' and 'y'")
    x, y = blob["x"], blob["y"]
    for key, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            _refuse(path, f"{key} is a {type(value).__name__}, not a tensor")
    if x.dim() < 2:
        _refuse(path, f"x has shape {tuple(x.shape)}; it needs a sample dim and a feature dim")
    if 0 in x.shape[1:]:
        _refuse(path, f"x has shape {tuple(x.shape)}: its samples hold no features")
    tokens = x.dtype == torch.int64 and y.shape == x.shape  # token ids in and out
    if tokens:  # feature: !text
        subject = f"data file {str(path)!r}: token ids in and out (int64 x, y of one shape)"  # feature: !text
        raise ConfigError(left_out("task.name=language_model", subject))  # feature: !text
    if x.dtype in (torch.float64, torch.float16, torch.bfloat16):
        x = x.float()  # models train in float32 (train.amp handles lower precision)
    elif not x.dtype.is_floating_point and not tokens:
        _refuse(path, f"x is {x.dtype}; convert it once, e.g. x.float() / 255 for 8-bit images")
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (N, H, W) grayscale -> (N, 1, H, W)
    if (
        y.dtype.is_complex
        or y.dtype == torch.bool
        or (not y.dtype.is_floating_point and y.dim() != 1 and not tokens)
    ):
        _refuse(
            path,
            f"y is {y.dtype} of shape {tuple(y.shape)}; it needs class ids "
            "(y.long(), or y.argmax(1) for one-hot rows) or float targets",
        )
    if len(x) != len(y):
        _refuse(path, f"x has {len(x)} samples but y has {len(y)} labels")
    if len(y) == 0:
        _refuse(path, "it holds no samples")
    y = y.float() if y.dtype.is_floating_point else y.long()
    if not y.dtype.is_floating_point and int(y.min()) < 0:
        _refuse(path, f"y holds {int(y.min())}; class ids start at 0")
    return x, y


# Ids are counted from 0 to the largest one, and the model gets an output (an embedding row)
# for each: an id far beyond the samples (a raw id such as 2,000,000,000) would ask for
# gigabytes. More ids than samples is allowed up to this many, for small files.
MIN_ID_BOUND = 10_000


def _check_count(path: Path, kind: str, count: int, samples: int) -> None:
    if count > max(samples, MIN_ID_BOUND):
        _refuse(
            path,
            f"it holds {kind} id {count - 1:,}, which asks for {count:,} {kind} ids for "
            f"{samples:,} samples; number the ids 0..K-1, e.g. "
            "torch.unique(y, return_inverse=True)[1]",
        )


def _refuse(path: Path, problem: str):
    raise ConfigError(f"data file {str(path)!r}: {problem}; expected {FORMAT}") from None
