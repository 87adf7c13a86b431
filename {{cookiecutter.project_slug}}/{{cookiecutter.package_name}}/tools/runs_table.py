"""The results of a folder of runs, read back: its runs.csv as rows, each run's best
validation value (from runs.csv, else its last checkpoint), and a Markdown table. Read by
compare_runs.py and by the tools that rank runs."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from ..errors import UserError, first_line


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def runs_table(output_dir: Path) -> dict[str, dict]:
    """<output_dir>/runs.csv (any output folder's) as {run name: row}."""
    path = output_dir / "runs.csv"
    if not path.exists():
        return {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return {row.get("run"): row for row in csv.DictReader(f)}
    except (UnicodeDecodeError, csv.Error) as exc:
        print(f"{path} does not read ({first_line(exc, 80)}): results from last.pt instead")
        return {}


def cell_float(value) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:  # a damaged cell
        return None


def best_value(output_dir: Path, run: str, metric: str, runs: dict) -> float | None:
    """The best validation value of run <output_dir>/<run>: its row of runs.csv (`runs`,
    from runs_table), else its last checkpoint's."""
    value = cell_float(runs.get(run, {}).get(f"best_val_{metric}"))
    if value is not None:
        return value
    last = output_dir / run / "last.pt"
    if not last.exists():
        return None
    from ..checkpoint import load  # torch: only for runs that never wrote their row

    try:
        best = load(last).get("progress", {}).get("best")
    except UserError as exc:  # a damaged checkpoint: this run has no result to show
        print(f"{run}: no result ({first_line(exc, 160)})", file=sys.stderr)
        return None
    return None if best is None else float(best)
