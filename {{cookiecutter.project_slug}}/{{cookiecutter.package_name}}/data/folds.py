"""Validation splits carved from one pool of samples: a held-out fraction, or k folds.

Both depend on data.split_seed only, not run.seed, so runs that differ only in their
seed see identical splits. When the pool has integer class labels `y`, both are stratified: every
class keeps its share in each part (to within one sample).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


def assign_folds(n: int, folds: int, seed: int, labels: torch.Tensor | None = None):
    """The fold (0..folds-1) of each of n samples: an int64 tensor of shape (n,)."""
    order = _order(n, seed, labels)
    fold_of = torch.empty(n, dtype=torch.long)
    fold_of[order] = torch.arange(n) % folds  # dealt round-robin: every class spreads evenly
    return fold_of


def holdout(n: int, fraction: float, seed: int, labels: torch.Tensor | None = None):
    """(train, val) index lists: `fraction` of the samples (of each class) for validation."""
    order = _order(n, seed, labels)
    if labels is None:
        cut = max(1, round(fraction * n))
        val = order[:cut]
    else:
        # Within the class-grouped order, the first round(fraction * n_c) of each class.
        sorted_labels = labels[order]
        counts = torch.bincount(sorted_labels)
        starts = torch.cumsum(counts, 0) - counts
        rank_in_class = torch.arange(n) - starts[sorted_labels]
        count = counts[sorted_labels]
        # At least one of each class for validation, and one left to train on.
        take = (fraction * count).round().clamp(min=1)
        take = torch.where(count >= 2, torch.minimum(take, count - 1), 0)
        val = order[rank_in_class < take]
    is_val = torch.zeros(n, dtype=torch.bool)
    is_val[val] = True
    return (~is_val).nonzero().squeeze(1).tolist(), is_val.nonzero().squeeze(1).tolist()


def _order(n: int, seed: int, labels: torch.Tensor | None) -> torch.Tensor:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if labels is not None:
        # A stable sort keeps the shuffled order within each class: classes in turn, each shuffled.
        order = order[torch.sort(labels[order], stable=True).indices]
    return order


def class_labels(pool: Dataset) -> torch.Tensor | None:
    """The pool's integer class labels (N,), when it holds them as a tensor `y`."""
    y = getattr(pool, "y", None)
    integer = isinstance(y, torch.Tensor) and not (y.is_floating_point() or y.is_complex())
    has_classes = bool(getattr(pool, "num_classes", None))
    return y if integer and has_classes and y.dim() == 1 and len(y) == len(pool) else None
