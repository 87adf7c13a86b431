"""The protocol between a task and everything that calls it (the loop, validation, the
logger, the summary and the tools), checked on a real batch before a run writes
anything: a task a user writes that returns the wrong kind or shape of thing is one line
naming the method and what it returned, not a traceback at the end of the first epoch."""

from __future__ import annotations

import copy
from numbers import Number

import torch
from torch import nn

from ..errors import ConfigError
from ..utils.metrics import flatten


def check_task(task, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Run each method of `task` once on the batch (x, y) with `model` (in eval mode, no
    gradients; its mode is restored) and check what it returns. A copy of the task is tried,
    so nothing it tunes (a threshold) or caches stays."""
    probe, name = copy.deepcopy(task), f"task {type(task).__name__}"
    was_training = model.training
    try:
        with torch.no_grad():
            output = model.eval()(x)
            _check_all(probe, name, output, y, len(x))
    finally:
        model.train(was_training)


def _check_all(task, name: str, output: torch.Tensor, y: torch.Tensor, n: int) -> None:
    loss = task.loss(output, y)
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
        _refuse(
            name, "loss(output, y)", loss, "the batch's mean loss, a float tensor of one value"
        )
    decoded = task.decode(output)
    if not (isinstance(decoded, torch.Tensor) and len(decoded) == n):
        _refuse(name, "decode(output)", decoded, f"a tensor of {n} rows (one per sample)")
    sums = task.sums(output, y)
    bad = _first(sums, lambda v: isinstance(v, torch.Tensor) and v.is_floating_point())
    if not isinstance(sums, dict) or bad:
        what = sums if not isinstance(sums, dict) else sums[bad]
        _refuse(name, "sums(output, y)" + (f"[{bad!r}]" if bad else ""), what, _SUMS)
    kept = [key for key in getattr(task, "gathered", ()) if key in sums]
    bad = _first({k: sums[k] for k in kept}, lambda v: isinstance(v, torch.Tensor) and len(v) == n)
    if bad:
        _refuse(name, f"sums(output, y)[{bad!r}]", sums[bad], f"{n} rows (it is in `gathered`)")
    added = {key: value.tolist() for key, value in sums.items() if key not in kept}
    metrics = task.summarise(added | {key: sums[key].cpu() for key in kept})
    if not isinstance(metrics, dict):
        _refuse(name, "summarise(sums)", metrics, "a dict of metrics {name: value}")
    bad = _first(metrics, _metric_value)
    if bad:
        _refuse(name, f"summarise(sums)[{bad!r}]", metrics[bad], _VALUE)
    missing = [m for m in [*getattr(task, "metrics", {}), "loss", "count"] if m not in metrics]
    if missing:
        _refuse(name, "summarise(sums)", f"no {missing[0]!r}", "every metric of `metrics`")
    flatten(metrics, getattr(task, "label_names", None))  # the records' names
    if hasattr(task, "rows"):
        rows, width = task.rows(decoded.cpu()), len(task.columns())
        if not (isinstance(rows, list) and len(rows) == n and all(len(r) == width for r in rows)):
            _refuse(name, "rows(decoded)", rows, f"{n} lists of {width} values (columns())")


_SUMS = "a dict {name: float tensor} (float64 sums over the batch)"
_VALUE = "a number, or a list of numbers (one per class or label)"


def _metric_value(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() <= 1
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, Number) for v in value)
    return isinstance(value, Number)


def _first(mapping, ok) -> str | None:
    """The first key of `mapping` whose value fails `ok` (None: all pass, or not a dict)."""
    if not isinstance(mapping, dict):
        return None
    return next((key for key, value in mapping.items() if not ok(value)), None)


def _refuse(name: str, method: str, got, wanted: str) -> None:
    if isinstance(got, torch.Tensor):
        got = f"a {str(got.dtype).removeprefix('torch.')} tensor of shape {tuple(got.shape)}"
    elif not isinstance(got, str):
        got = f"{type(got).__name__} {repr(got)[:60]}"
    raise ConfigError(f"{name}: {method} returned {got}; it must return {wanted} (tasks/)")
