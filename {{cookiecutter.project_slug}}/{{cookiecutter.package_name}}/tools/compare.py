"""Compare finished or running runs side by side (scripts/compare_runs.py): a table of each run's
best metric, epochs, steps, wall time and only the settings that differ between them, and one
plot of their validation curves, a colour per run.

Everything is read from the run folders (config.yaml, metrics.csv; the best value from
runs.csv, else last.pt), so runs from different output folders mix freely. The
plot follows outputs.check_out: never over a run's file; an existing file only where it is
a plot this tool drew (a PNG text chunk says so), or with --force.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import sys
from pathlib import Path

import yaml

from ..config import from_dict
from ..errors import UserError
from ..utils import provenance
from ..utils.plots import INSTALL_HINT, available, read_columns, save_figure, subplot_grid
from . import cli, outputs
from .reproduce import flat
from .runs_table import best_value, markdown_table, runs_table

# How a run was named or started, not how it trained: never listed as a difference.
NOT_COMPARED = ("run.name", "train.resume")
_MISSING = "-"  # a setting one run's config lacks (an older version of the project)
MARK = {"Description": "compare_runs.py: validation curves"}  # in the PNG: this tool's own


def is_compare_plot(path: Path) -> bool:
    """Whether `path` is a PNG this tool drew: its text chunks (before the image) hold MARK."""
    chunk = b"tEXtDescription\0" + MARK["Description"].encode()
    try:
        with path.open("rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and chunk in head


def compare(args: list[str], out: Path | None, x: str = "step", force: bool = False) -> int:
    """Print the table of the runs that `args` name and draw `out` (None: compare.png in the
    folder that holds them, as checkpoints/ holds checkpoints/*, never the working folder); 0.
    A run that cannot be read is skipped with a line."""
    runs, summaries = [], []
    for run in find_runs(args):
        try:
            summaries.append(summarise(run))
            runs.append(run)
        except UserError as exc:  # one damaged run does not hide the others
            print(f"skipped {run.name}: {exc}; the other runs are compared", file=sys.stderr)
    if not runs:
        raise UserError(f"no run among {' '.join(args)} could be read (see the lines above)")
    out = out or Path(os.path.commonpath([run.parent for run in runs])) / "compare.png"
    outputs.check_out(out, runs, is_compare_plot, force)
    labels = _labels(runs)
    print(table(labels, summaries))
    curves = {label: s["columns"] for label, s in zip(labels, summaries, strict=True)}
    cli.placing_output()  # the table is printed; a stop now waits for the plot
    lines = plot_overlay(curves, out, x)
    if lines:
        print(f"validation curves: {out}")
    elif not available():
        print(f"no plot without matplotlib; to draw it: {INSTALL_HINT}")
    else:
        print(f"no plot: no validation rows in these runs' metrics.csv yet; {out} not written")
    return 0


def find_runs(args: list[str]) -> list[Path]:
    """The run folders that `args` name: a run folder, a folder of runs (an output
    folder), or a glob of either (quoted, or expanded by the shell). Files a glob matches
    (runs.csv, README.md) are passed over; a folder that holds no run is an error."""
    runs: list[Path] = []
    for arg in args:
        paths = sorted(glob.glob(arg)) if any(c in arg for c in "*?[") else [arg]
        if not paths:
            raise UserError(f"{arg!r} matches nothing; pass run folders, e.g. checkpoints/*")
        for path in map(Path, paths):
            runs += _runs_in(path)
    runs = list(dict.fromkeys(run.resolve() for run in runs))
    if not runs:
        raise UserError(f"no run folder among {' '.join(args)}; pass checkpoints/<run.name>")
    return runs


def _runs_in(path: Path) -> list[Path]:
    if not path.exists():
        raise UserError(f"{str(path)!r} does not exist; pass run folders, e.g. checkpoints/*")
    if not path.is_dir():
        return []
    if _is_run(path):
        return [path]
    inner = sorted(child for child in path.iterdir() if child.is_dir() and _is_run(child))
    if not inner:
        raise UserError(
            f"{str(path)!r} is not a run folder (no config.yaml) and holds none; pass "
            "folders that training wrote, e.g. checkpoints/<run.name>"
        )
    return inner


def _is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def _best_metric(config: dict, run: Path) -> str:
    """The metric that picked the run's best.pt (auto: its task's first)."""
    try:
        return from_dict(config).best()[0]
    except UserError as exc:  # a config of another version of this project
        raise UserError(f"{str(run / 'config.yaml')!r}: {exc}") from None


def summarise(run: Path) -> dict:
    """What the table and the plot show of one run."""
    path = run / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        raise UserError(f"{str(path)!r} is not valid YAML") from None
    except UnicodeDecodeError:
        raise UserError(f"{str(path)!r} is not UTF-8 text") from None
    if not isinstance(config, dict):
        raise UserError(f"{str(path)!r} is not a config (a mapping of sections)")
    try:
        columns = read_columns(run / "metrics.csv")
    except (UnicodeDecodeError, csv.Error):
        raise UserError(f"{str(run / 'metrics.csv')!r} is not UTF-8 CSV text") from None
    metric = _best_metric(config, run)
    elapsed = _last(columns.get("time/elapsed_s", []))
    if math.isnan(elapsed):  # runs from before time/elapsed_s: training time only
        elapsed = math.fsum(v for v in columns.get("time/train_s", []) if not math.isnan(v))
    return {
        # What made each run beside its settings: a package or data file that differs
        # between two runs matters as much as a learning rate.
        "settings": {**_settings(config), **flat(provenance.read(run))},
        "columns": columns,
        "metric": metric,
        "best": best_value(run.parent, run.name, metric, runs_table(run.parent)),
        "epochs": _last(columns.get("epoch", [])),
        "steps": _last(columns.get("step", [])),
        "wall_s": elapsed,
    }


def differing(settings: list[dict]) -> list[str]:
    """The settings whose values are not the same in every run, in config order."""
    keys = dict.fromkeys(key for s in settings for key in s if key not in NOT_COMPARED)
    return [key for key in keys if len({repr(s.get(key, _MISSING)) for s in settings}) > 1]


def table(labels: list[str], summaries: list[dict]) -> str:
    keys = differing([s["settings"] for s in summaries])
    metrics = {s["metric"] for s in summaries}
    best = f"best val {next(iter(metrics))}" if len(metrics) == 1 else "best val"
    rows = []
    for label, s in zip(labels, summaries, strict=True):
        value = "-" if s["best"] is None else f"{s['best']:.4f}"
        if len(metrics) > 1:
            value = f"{s['metric']} {value}"
        cells = [label, value, _count(s["epochs"]), _count(s["steps"]), _duration(s["wall_s"])]
        rows.append(cells + [str(s["settings"].get(key, _MISSING)) for key in keys])
    return markdown_table(["run", best, "epochs", "steps", "wall time", *keys], rows)


def plot_overlay(runs: dict[str, dict[str, list[float]]], out: Path, x: str = "step") -> int:
    """One panel per scalar validation metric (a vector's entries, val/f1/<class>, would be
    a panel per class; they stay in each run's metrics.csv), a line per run in its colour
    (the same in every panel); returns the number of lines drawn, 0 (and no file) without
    matplotlib or data."""
    metrics = list(
        dict.fromkeys(
            c for cols in runs.values() for c in cols if c[:4] == "val/" and c.count("/") == 1
        )
    )
    if not metrics or not available():
        return 0
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    cmap = colormaps["tab10" if len(runs) <= 10 else "viridis"]
    colours = [cmap(i if len(runs) <= 10 else i / (len(runs) - 1)) for i in range(len(runs))]
    fig, axes = subplot_grid(len(metrics))
    for ax, metric in zip(axes, metrics, strict=True):
        for columns, colour in zip(runs.values(), colours, strict=True):
            if metric in columns and x in columns:
                ax.plot(columns[x], columns[metric], color=colour, marker="o", markersize=3)
        ax.set_title(metric)
        ax.set_xlabel(x)
    legend = [
        Line2D([], [], color=c, marker="o", label=label)
        for label, c in zip(runs, colours, strict=True)
    ]
    axes[0].legend(handles=legend, fontsize="small")
    return save_figure(fig, out, MARK)


def _settings(config: dict) -> dict:
    """The config as {section.key: value}."""
    out = {}
    for section, values in config.items():
        if isinstance(values, dict):
            out.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            out[section] = values
    return out


def _labels(runs: list[Path]) -> list[str]:
    """Each run's folder name, or parent/name where names repeat (runs of two folders)."""
    names = [run.name for run in runs]
    return [
        run.name if names.count(run.name) == 1 else f"{run.parent.name}/{run.name}" for run in runs
    ]


def _last(values: list[float]) -> float:
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def _count(value: float) -> str:
    return "-" if math.isnan(value) else str(int(value))


def _duration(seconds: float) -> str:
    if math.isnan(seconds) or seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def compare_main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(
        description="Compare runs: a table of their results and the settings that differ, "
        "and their validation curves on one plot."
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run folders (checkpoints/<run.name>), folders of runs, or a glob: checkpoints/*",
    )
    parser.add_argument(
        "--out",
        help="the plot (default: compare.png in the folder holding the runs); a plot this tool "
        "drew is replaced, any other existing file only with --force",
    )
    cli.force_option(parser, "a plot this tool drew")
    parser.add_argument("--x", choices=("step", "epoch"), default="step", help="x axis")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        return compare(args.runs, Path(args.out) if args.out else None, args.x, args.force)

    return cli.guard(run, args.debug, stoppable=True)
