"""Plots of a run's metrics.csv with matplotlib, which is optional (`pip install -e '.[plots]'`).

`plot_curves` draws <run folder>/curves.png from whatever columns metrics.csv holds: a loss
panel (train and val), one panel per other `val/<metric>`, and the learning rate, all
against the step. scripts/compare_runs.py and the other reports draw through the same helpers.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import sys
from pathlib import Path

from .locks import temporary

INSTALL_HINT = "pip install -e '.[plots]'"  # the extra in pyproject.toml: matplotlib


def available() -> bool:
    """Whether matplotlib can be imported, without importing it (that takes ~0.5 s)."""
    if "matplotlib" in sys.modules:  # None there means "import refused" (tests simulate that)
        return sys.modules["matplotlib"] is not None
    return importlib.util.find_spec("matplotlib") is not None


def subplot_grid(panels: int):
    """A figure of `panels` axes, up to three a row (unused cells hidden), drawn by the
    headless Agg canvas; (None, []) when matplotlib is missing. No pyplot: nothing global
    (no display, no figure registry to close), so drawing is safe in any process."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None, []
    cols = min(panels, 3)
    rows = math.ceil(panels / cols)
    width, height = 4.5 * cols, 3.5 * rows
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Fixed margins, in inches: room for tick labels, titles and a suptitle. tight_layout
    # would find them by drawing the figure twice, which doubles the cost of each drawing.
    axis_width = (width - 1.1 - 0.8 * (cols - 1)) / cols
    axis_height = (height - 1.3 - 0.8 * (rows - 1)) / rows
    fig.subplots_adjust(
        left=0.8 / width,
        right=1 - 0.3 / width,
        bottom=0.6 / height,
        top=1 - 0.7 / height,
        wspace=0.8 / axis_width,
        hspace=0.8 / axis_height,
    )
    flat = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def save_figure(fig, path: Path, metadata: dict | None = None) -> int:
    """Write the PNG through a temporary file and a rename: a reader (an image viewer
    refreshing, a sync job) never sees half a file. `metadata`: PNG text chunks (a tool's
    mark on its own output). Returns the number of lines the figure holds, which tests check."""
    tmp = temporary(path)  # locks.remove_stale knows the name
    try:
        fig.savefig(tmp, format="png", dpi=100, metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return sum(len(ax.get_lines()) for ax in fig.axes)


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
    Generic on purpose: every `val/<metric>` the task logs gets its own panel, a vector's
    entries (`val/f1/<class>`) one panel together, a line each."""
    train_loss = [c for c in ("train/loss", "train/epoch_loss") if c in columns][:1]
    val_loss = [c for c in ("val/loss",) if c in columns]
    panels = {"loss": train_loss + val_loss}
    for column in columns:
        if column.startswith("val/") and column != "val/loss":
            panels.setdefault("/".join(column.split("/")[:2]), []).append(column)
    panels["learning rate"] = [c for c in ("train/lr", "lr") if c in columns][:1]
    return {title: cols for title, cols in panels.items() if cols}


def plot_curves(metrics_csv: Path, out: Path) -> int:
    """Draw out (curves.png) from metrics_csv; returns the number of lines the figure holds
    (0: matplotlib missing or nothing to draw yet, and no file written)."""
    columns = read_columns(metrics_csv)
    panels = curve_panels(columns)
    if "step" not in columns or not panels:
        return 0
    fig, axes = subplot_grid(len(panels))
    if fig is None:
        return 0
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
    return save_figure(fig, out)


def _number(value: str | None) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
