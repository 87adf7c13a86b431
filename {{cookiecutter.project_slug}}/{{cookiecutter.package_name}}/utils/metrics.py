"""Metrics as the records hold them: a task's `summarise` may return per-class / per-label
vectors besides scalars; everything that writes or ranks metrics (metrics.csv, TensorBoard,
the trackers, the console, the run summary, runs.csv, the reports) sees one flat dict of
numbers, a vector's entries named `<metric>/<class name>`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Number


def flatten(metrics: Mapping, names: Sequence[str] | None = None) -> dict:
    """{name: scalar or 1-D vector} -> {name: scalar, f"{name}/{label}": float}: a vector's
    entries take the class / label names `names` where it has as many, else their indices.
    Scalars (and already flat entries) pass unchanged, so flattening twice changes nothing.
    A nested vector raises TypeError naming the metric."""
    flat = {}
    for key, value in metrics.items():
        if hasattr(value, "tolist"):  # tensors, numpy arrays (torch-free: configs import this)
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            flat[key] = value
            continue
        if any(not isinstance(v, Number) for v in value):
            raise TypeError(
                f"metric {key!r} is not a scalar or a 1-D vector of numbers "
                f"({type(value[0]).__name__} inside); return one value per class or label"
            )
        labels = names if names is not None and len(names) == len(value) else range(len(value))
        flat |= {f"{key}/{label}": float(v) for label, v in zip(labels, value, strict=True)}
    return flat


def direction(directions: Mapping[str, str], metric: str) -> str | None:
    """The direction, max or min, of `metric` from a task's {name: direction}; a vector's entry
    (`f1/<class>`) has its vector's (`f1`). None for a name the task does not have."""
    if metric in directions:
        return directions[metric]
    return directions.get(metric.split("/", 1)[0]) if "/" in metric else None
