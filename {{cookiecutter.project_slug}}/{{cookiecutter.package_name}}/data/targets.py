"""Statistics of the training split's targets that a task needs and every checkpoint keeps:
"value" targets' mean and std (regression standardises with them), "class" targets' counts
(task.class_weights=auto), "labels" targets' positives per label (task.pos_weight=auto).""" # feature: multilabel
(task.class_weights=auto); and the order of a table's classes.""" # feature: !multilabel

from __future__ import annotations

import torch

from ..errors import ConfigError  # feature: multilabel
from .folds import class_labels
from .in_memory import InMemoryDataset, mean_and_std


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def sorted_names(labels) -> list[str]:
    """The distinct names of `labels`, in numeric order where all are numbers (2 before 10),
    else in text order: the order of a table's classes."""
    names = set(labels)
    numeric = all(is_number(n) for n in names)
    return sorted(names, key=float) if numeric else sorted(names)


def target_stats(dataset, indices, targets: str, saved: dict | None) -> dict:
    """The mean and std per target of the training rows `indices` of "value" targets, which
    the regression task standardises with, and the class counts of "class" targets (for
    task.class_weights=auto): a checkpoint's own where `saved` is given (checkpoints from
    before these statistics have none: the task then reads mean 0, std 1)."""
    keys = {
        "value": ("target_mean", "target_std"),
        "class": ("class_counts",),
        "labels": ("label_counts", "label_rows"),  # feature: multilabel
    }.get(targets)
    if keys is None:
        return {}
    if saved is not None:
        return {key: saved[key] for key in keys if key in saved}
    rows = torch.as_tensor(list(indices), dtype=torch.int64)
    if targets == "class":  # for task.class_weights=auto, where the labels are a tensor
        labels = class_labels(dataset)
        if labels is None:
            return {}
        counts = torch.bincount(labels[rows], minlength=dataset.num_classes)
        return {"class_counts": counts.tolist()}
    if isinstance(dataset, InMemoryDataset):
        y = dataset.y[rows]
    else:  # one pass over the training targets, once per run
        y = torch.stack([torch.as_tensor(dataset[i][1]) for i in rows.tolist()])
    # >>> multilabel
    if targets == "labels":  # positives per label, for task.pos_weight=auto
        y = y.view(len(y), -1)
        if not ((y == 0) | (y == 1)).all():
            raise ConfigError(
                f"data.name={getattr(dataset, 'name', type(dataset).__name__)}: multi-label "
                "targets must be 0 or 1 per label; give y as a 0/1 float tensor (N, L)"
            )
        return {"label_counts": y.sum(0).tolist(), "label_rows": len(y)}
    # <<< multilabel
    mean, std = mean_and_std(y.view(len(y), -1))
    return {"target_mean": mean.tolist(), "target_std": std.tolist()}
