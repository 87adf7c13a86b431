"""Validation: a task's metrics over a whole split, each sample counted once on any number of
ranks (the loop's epoch ends, scripts/evaluate.py and its report)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from . import checkpoint, distributed
from .data import build_loader, build_test_set, close_loader, empty_batch
from .fsdp import even_batches, is_sharded  # feature: fsdp
from .tasks import TASKS
from .utils.device import autocast, to_device
from .utils.metrics import flatten


@torch.no_grad()  # not inference_mode: an fsdp model's first all-gather fails under it  # feature: fsdp
@torch.no_grad()  # feature: !fsdp
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


def held_out_test(cfg, data):
    """The test split (data.test_path, an image folder's test/) read with the training run's
    preprocessing, or None: read and checked before anything is written, and its path and
    size recorded in `data.meta` (saved in every checkpoint), as the validation split is."""
    targets = TASKS[cfg.task.name].targets
    test = build_test_set(cfg.data, targets, data.meta, source_name="the training table")
    if test is not None:
        data.meta["test"] = {"path": str(test.path), "samples": len(test)}
    return test


def score_test(cfg, dist, device, data, trainee, test_set, complete: bool):
    """(metrics, which model) on the test split, once at the end of a complete run (every rank
    takes part), or None: best.pt's weights where the run has one, else the final model's
    (fsdp: best.pt is sharded; evaluate.py --split test scores its consolidated file)."""  # feature: fsdp
    takes part), or None: best.pt's weights where the run has one, else the final model."""  # feature: !fsdp
    if test_set is None or not complete:
        return None
    distributed.barrier()  # rank 0 has written best.pt
    best = Path(cfg.run.output_dir) / cfg.run.name / "best.pt"
    model, which = trainee.model, "final model"
    if best.is_file() and not is_sharded(model):  # feature: fsdp
    if best.is_file():  # feature: !fsdp
        model, which = copy.deepcopy(model), "best.pt"
        weights = checkpoint.model_weights(checkpoint.load(best), best)
        checkpoint.load_model_state(model, weights, str(best))
    args = dict(seed=cfg.run.seed, rank=dist.rank, world_size=dist.world_size)
    loader = build_loader(test_set, cfg.data, 2 * cfg.train.batch_size, train=False, **args)
    try:
        loader = even_batches(loader, model, device)  # feature: fsdp
        return evaluate(model, loader, data.task, device, cfg.train.amp), which
    finally:
        close_loader(loader)
