"""Validation: a task's metrics over a whole split, each sample counted once on any number of
ranks (the loop's epoch ends, scripts/evaluate.py and its report)."""

from __future__ import annotations

import torch
from torch import nn

from . import distributed
from .data import empty_batch
from .utils.device import autocast, to_device
from .utils.metrics import flatten


@torch.no_grad()  # not inference_mode: an fsdp model's first all-gather fails under it
def evaluate(
    model: nn.Module, loader, task, device: torch.device, amp: str = "off", observe=None
) -> dict:
    """The task's metrics over the whole split, counting each sample once on any number of
    ranks: the task's named sums are added per batch and all-reduced once, never per-rank
    means. `observe(output, y)`, if given, sees every batch, its outputs in the targets' units
    (task.decode; e.g. report.Collector). A vector metric of the task's `summarise` comes back
    flat, one entry per class / label (`f1/<name>`, utils/metrics.flatten)."""
    was_training = model.training
    model.eval()
    totals = None
    mixed_precision = autocast(device, amp)
    for batch in loader:
        x, y = to_device(batch, device)
        with mixed_precision:
            output = model(x)
        sums = task.sums(output, y)
        if observe is not None:
            observe(task.decode(output), y)
        totals = sums if totals is None else {k: totals[k] + v for k, v in sums.items()}
    if totals is None:  # no sample on this rank (fewer than ranks): zeros of the right size
        x, y = to_device(empty_batch(loader.dataset), device)
        totals = task.sums(model(x), y)
    totals = distributed.all_reduce_sums(totals)
    model.train(was_training)
    metrics = task.summarise({k: v.tolist() for k, v in totals.items()})
    return flatten(metrics, getattr(task, "label_names", None))
