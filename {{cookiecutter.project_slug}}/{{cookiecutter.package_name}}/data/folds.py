"""K-fold splits of the training split: `data.folds=K data.fold=i` validates on fold i.

Both the training and the validation set come from the dataset's training split (its own
validation split is not read). Each training sample is assigned to one fold, the same way
for every fold i and every run.seed: the assignment depends on data.fold_seed only, so the
runs of a multi-seed k-fold sweep see identical folds. When the dataset has integer labels
`y`, the split is stratified: a seeded shuffle, grouped by class, dealt round-robin, so each
fold holds every class to within one sample and the fold sizes differ by at most one.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..config import DataConfig
from ..errors import ConfigError
from .in_memory import InMemoryDataset


def assign_folds(n: int, folds: int, seed: int, labels: torch.Tensor | None = None):
    """The fold (0..folds-1) of each of n samples: an int64 tensor of shape (n,)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if labels is not None:
        # A stable sort keeps the shuffled order within each class: classes in turn, each
        # shuffled. Dealing that sequence round-robin spreads every class evenly over folds.
        order = order[torch.sort(labels[order], stable=True).indices]
    fold_of = torch.empty(n, dtype=torch.long)
    fold_of[order] = torch.arange(n) % folds
    return fold_of


def fold_split(pool: Dataset, cfg: DataConfig, split: str) -> Dataset:
    """Fold `cfg.fold` of `pool` for split "val", every other fold for "train"."""
    n = len(pool)
    if cfg.folds > n:
        raise ConfigError(f"data.folds={cfg.folds} exceeds the {n} training samples")
    fold_of = assign_folds(n, cfg.folds, cfg.fold_seed, _class_labels(pool))
    chosen = fold_of == cfg.fold if split == "val" else fold_of != cfg.fold
    indices = chosen.nonzero().squeeze(1)
    if isinstance(pool, InMemoryDataset):
        return InMemorySubset(pool, indices)
    return IndexedSubset(pool, indices.tolist())


def _class_labels(pool: Dataset) -> torch.Tensor | None:
    y = getattr(pool, "y", None)
    integer = isinstance(y, torch.Tensor) and not (y.is_floating_point() or y.is_complex())
    return y if integer and y.dim() == 1 and len(y) == len(pool) else None


class InMemorySubset(InMemoryDataset):
    """The rows `indices` of an in-memory dataset, copied: batches stay one gather."""

    def __init__(self, pool: InMemoryDataset, indices: torch.Tensor):
        self.x, self.y = pool.x[indices], pool.y[indices]
        self.indices = indices  # positions in the training split, for inspection
        self.input_shape, self.num_classes = pool.input_shape, pool.num_classes


class IndexedSubset(Dataset):
    """The samples `indices` of any dataset, one at a time. Not torch's Subset: that defines
    __getitems__, which build_loader reads as "returns whole batches"."""

    def __init__(self, pool: Dataset, indices: list[int]):
        self.pool, self.indices = pool, indices
        self.input_shape, self.num_classes = pool.input_shape, pool.num_classes

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.pool[self.indices[i]]
