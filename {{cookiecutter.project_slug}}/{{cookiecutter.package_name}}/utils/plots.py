"""Plots of a run's metrics.csv with matplotlib, which is optional (`pip install -e '.[plots]'`).

`plot_curves` draws <run folder>/curves.png from whatever columns metrics.csv holds: a loss
panel (train and val), one panel per other `val/<metric>`, and the learning rate, all
against the step. The sweep report and scripts/compare_runs.py draw through the same helpers.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

INSTALL_HINT = "pip install -e '.[plots]'"  # the extra in pyproject.toml: matplotlib


def pyplot():
    """matplotlib.pyplot on the headless Agg backend, or None when matplotlib is missing.
    Agg draws to files only: no display, no GUI toolkit, safe in any process."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: Path) -> int:
    """Write the PNG through a temporary file and a rename, then free the figure: a reader (an
    image viewer refreshing, a sync job) never sees half a file. Returns the number of lines
    the figure held, which tests check."""
    lines = sum(len(ax.get_lines()) for ax in fig.axes)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)  # pyplot keeps every figure alive until closed
    return lines


def read_columns(path: Path) -> dict[str, list[float]]:
    """metrics.csv as {column: values}; a cell that is not a number (empty, text) is NaN,
    which matplotlib leaves as a gap."""
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    columns: dict[str, list[float]] = {}
    for i, row in enumerate(rows):
        for key, value in row.items():
            if key is None:  # a row longer than the header (a column added on resume)
                continue
            columns.setdefault(key, [math.nan] * i).append(_number(value))
        for values in columns.values():  # a column this row lacks
            values.extend([math.nan] * (i + 1 - len(values)))
    return columns


def curve_panels(columns: dict[str, list[float]]) -> dict[str, list[str]]:
    """Which columns go in which panel: {panel title: [column, ...]}, empty panels left out.
    Generic on purpose: every `val/<metric>` the task logs gets its own panel."""
    train_loss = [c for c in ("train/loss", "train/epoch_loss") if c in columns][:1]
    val_loss = [c for c in ("val/loss",) if c in columns]
    panels = {"loss": train_loss + val_loss}
    for column in columns:
        if column.startswith("val/") and column != "val/loss":
            panels[column] = [column]
    panels["learning rate"] = [c for c in ("train/lr", "lr") if c in columns][:1]
    return {title: cols for title, cols in panels.items() if cols}


def plot_curves(metrics_csv: Path, out: Path) -> int:
    """Draw out (curves.png) from metrics_csv; returns the number of lines the figure holds
    (0: matplotlib missing or nothing to draw yet, and no file written)."""
    plt = pyplot()
    columns = read_columns(metrics_csv)
    panels = curve_panels(columns)
    if plt is None or "step" not in columns or not panels:
        return 0
    fig, axes = subplot_grid(plt, len(panels))
    for ax, (title, names) in zip(axes, panels.items(), strict=True):
        for name in names:
            ax.plot(columns["step"], columns[name], marker="o", markersize=3, label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if len(names) > 1:
            ax.legend()
    fig.suptitle(metrics_csv.parent.name)
    fig.tight_layout()
    return save_figure(fig, out)


def subplot_grid(plt, panels: int):
    """A figure of `panels` axes, up to three a row; the unused cells of the grid are hidden."""
    cols = min(panels, 3)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def _number(value: str | None) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
