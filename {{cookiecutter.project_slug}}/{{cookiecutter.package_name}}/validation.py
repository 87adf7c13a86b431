"""Validation: a task's metrics over a whole split, each sample counted once on any number of
ranks (the loop's epoch ends, scripts/evaluate.py and its report)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from . import checkpoint, distributed
from .config import load_config
from .data import build_loader, build_test_set, close_loader, empty_batch
from .errors import UserError
from .fsdp import even_batches, is_sharded  # feature: fsdp
from .microbatch import parts
from .tasks import frozen_task
from .utils.device import autocast, sums_dtype, to_device
from .utils.metrics import flatten


@torch.no_grad()  # not inference_mode: an fsdp model's first all-gather fails under it  # feature: fsdp
@torch.no_grad()  # feature: !fsdp
def evaluate(
    model: nn.Module,
    loader,
    task,
    device: torch.device,
    amp: str = "off",
    observe=None,
    split: str = "the validation split",
    rows: int = 0,
) -> dict:
    """The task's metrics over the whole split, counting each sample once on any number of
    ranks: the task's named sums are added per batch and all-reduced once, never per-rank
    means (Totals). `observe(output, y)`, if given, sees every batch, its outputs in the
    targets' units (task.decode; e.g. report.Collector). A vector metric of the task's
    `summarise` comes back flat, one entry per class / label (`f1/<name>`,
    utils/metrics.flatten). Outputs that are not finite stop it with one line naming `split`
    (NonFiniteOutput). `rows`: at most so many inputs per forward pass (train.micro_batch_size;
    the sums add up the same), 0: the loader's batches."""
    was_training = model.training
    model.eval()
    totals = Totals(task, device)
    mixed_precision = autocast(device, amp)
    for batch in loader:
        for x, y in parts(*to_device(batch, device), rows):
            with mixed_precision:
                output = model(x)
            totals.add(task.sums(output, y), output)
            if observe is not None:
                observe(task.decode(output), y)
    if totals.empty:  # no sample on this rank (fewer than ranks): zeros of the right size
        x, y = to_device(empty_batch(loader.dataset), device)
        output = model(x)
        totals.add(task.sums(output, y), output)
    model.train(was_training)
    return flatten(totals.metrics(split), getattr(task, "label_names", None))


def notes(task, metrics: dict, best_metric: str, said: set) -> list[str]:
    """Lines a run prints about its validation, each once (`said`: those printed before):
    the task's own note (a threshold tuned on too few positives), and a train.best_metric
    that is nan, so it chooses no best.pt."""
    lines = [task.note] if getattr(task, "note", None) else []
    if math.isnan(metrics[best_metric]):
        lines.append(
            f"warning: val {best_metric} is nan on this validation split (AUROC of a split "
            "with one class, say), so it does not choose best.pt; choose another "
            "train.best_metric, or a validation split with both classes"
        )
    new = [line for line in lines if line not in said]
    said.update(new)
    return new


class NonFiniteOutput(UserError):
    """A model whose outputs on a split are nan or inf: its metrics would mean nothing."""


class Totals:
    """A task's sums over a split's batches, then over ranks: added per name, except those
    the task names in `gathered` (rows per sample), which are concatenated; and a count of
    the outputs that are not finite, kept on the device (no sync per batch)."""

    def __init__(self, task, device: torch.device):
        self.task, self.kept = task, getattr(task, "gathered", ())
        self.added, self.rows = None, {}
        self.bad = torch.zeros((), dtype=sums_dtype(device), device=device)

    @property
    def empty(self) -> bool:
        return self.added is None

    def add(self, sums: dict, output: torch.Tensor) -> None:
        for key in self.kept:
            if key in sums:
                self.rows.setdefault(key, []).append(sums.pop(key))
        added = self.added
        self.added = sums if added is None else {k: added[k] + v for k, v in sums.items()}
        self.bad += output.numel() - torch.isfinite(output).sum()

    def metrics(self, split: str = "the validation split") -> dict:
        """The task's `summarise` of every rank's totals (a collective: all ranks call it)."""
        totals = distributed.all_reduce_sums({**self.added, "_nonfinite": self.bad})
        if totals.pop("_nonfinite").item() > 0:
            raise NonFiniteOutput(
                f"the model's outputs on {split} are not finite (nan or inf), so no metric "
                "of it means anything and nothing was saved from it: lower train.lr, use "
                "train.amp=bf16 instead of fp16, or check the inputs for nan"
            )
        given = {k: v.tolist() for k, v in totals.items()}
        for key, rows in self.rows.items():  # every rank's rows, as one CPU tensor
            given[key] = distributed.all_gather_rows(torch.cat(rows)).cpu()
        return self.task.summarise(given)


def held_out_test(data_cfg, targets: str, data):
    """The test split (data.test_path, an image folder's test/) read with the training run's
    preprocessing, or None: read and checked before anything is written, and its path and
    size recorded in `data.meta` (saved in every checkpoint), as the validation split is."""
    test = build_test_set(data_cfg, targets, data.meta, source_name="the training table")
    if test is not None:
        data.meta["test"] = {"path": str(test.path), "samples": len(test)}
    return test


def score_test(loop, test_set, task_cfg):
    """(metrics, which model) on the test split, once at the end of a complete run (every rank
    takes part), or None: best.pt's weights where the run has one, else the final model's
    (fsdp: best.pt is sharded; evaluate.py --split test scores its consolidated file).  # feature: fsdp
    takes part), or None: best.pt's weights where the run has one, else the final model.  # feature: !fsdp
    Scored as `evaluate.py --split test` scores that checkpoint: its task with its own
    tuned threshold(s) frozen (tasks.frozen_task), never tuned on the test split."""
    if test_set is None:
        return None
    distributed.barrier()  # rank 0 has written best.pt
    best, data, device = loop.run_dir / "best.pt", loop.data, loop.device
    model, which, meta = loop.trainee.model, "final model", data.meta
    if best.is_file() and not is_sharded(model):  # feature: fsdp
    if best.is_file():  # feature: !fsdp
        model, which, state = copy.deepcopy(model), "best.pt", checkpoint.load(best)
        checkpoint.load_model_state(model, checkpoint.model_weights(state, best), str(best))
        meta, task_cfg = state["data"], load_config(base=state["config"]).task
    task = frozen_task(task_cfg, data.task.num_outputs, meta)
    size = 2 * loop.train.batch_size  # as the validation loader
    loader = build_loader(test_set, batch_size=size, train=False, **data.loader_args)
    try:
        loader = even_batches(loader, model, device)  # feature: fsdp
        return evaluate(model, loader, task, device, loop.train.amp, split="the test split"), which
    finally:
        close_loader(loader)
