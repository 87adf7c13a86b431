"""A sweep's results: each trial's best validation metric (from <sweep dir>/runs.csv, else its
last checkpoint), mean ± std over the seeds/folds of a config, a markdown table ranked by it
(ties broken by the task's next metric, and said), results.csv, best.yaml (the best trial's
whole config, for --config) and metric_vs_<key>.png. A trial whose records no longer read is
skipped with a line."""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from pathlib import Path

import yaml

from ..config import components, from_dict
from ..errors import UserError, first_line
from ..utils import locks, run_files
from ..utils.plots import INSTALL_HINT, available, read_columns, save_figure, subplot_grid
from .runs_table import best_value, cell_float, markdown_table, runs_table

# Per-run settings that best.yaml leaves out: it describes a config, not one run of it.
NOT_IN_BEST = {"run": ("name", "output_dir"), "train": ("resume",), "data": ("fold", "folds")}


def aggregate(values: list[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count."""
    if not values:
        return float("nan"), float("nan"), 0
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std, len(values)


def report(sweep_dir: Path, trials: list[dict]) -> int:
    """Print the ranked table and write results.csv, best.yaml and the plots; 0, or 1 when
    no trial has a result yet."""
    runs = runs_table(sweep_dir)
    order = None  # (metric, mode, next metric, its mode): the task's, from a trial's config
    by_group: dict[str, dict] = {}
    for trial in trials:
        group = by_group.setdefault(
            trial["group"],
            {"settings": trial["settings"], "values": [], "next": [], "trials": [], "configs": {}},
        )
        group["trials"].append(trial)
        read = _readable_config(sweep_dir / trial["id"]) if trial["state"] == "done" else None
        if read is None:
            continue
        group["configs"][trial["id"]], cfg = read
        order = _order(cfg)
        value = best_value(sweep_dir, trial["id"], order[0], runs)
        if value is not None:
            group["values"].append(value)
            group["next"].append(_next_value(sweep_dir, trial["id"], value, order, runs))
    if order is None:
        print(f"no finished trial in {sweep_dir} yet")
        return 1
    metric, mode = order[:2]
    rows = rank(by_group, mode, order[3])
    keys = list(dict.fromkeys(k for g in by_group.values() for k in g["settings"]))
    print(table(rows, keys, metric, mode))
    for line in ties(rows, order):
        print(line)
    _write_csv(sweep_dir / run_files.RESULTS, rows, keys, metric)
    best = rows[0]
    if best["n"]:
        _write_best(sweep_dir, best)
        print(f"best: {best['group']}; its config: {sweep_dir / 'best.yaml'}")
    plot(sweep_dir, rows, keys, metric)
    return 0


def _order(cfg) -> tuple[str, str, str | None, str]:
    """The ranking metric and its mode, then the task's next metric (the tie-break) and its."""
    metric, mode = cfg.best()
    task = components("task")[cfg.task.name]
    directions, vectors = task.metrics, getattr(task, "vector_metrics", ())
    after = next((m for m in directions if m != metric and m not in vectors), None)
    return metric, mode, after, directions.get(after, "min")


def _readable_config(run_dir: Path) -> tuple[dict, object] | None:
    """The trial's config.yaml as a dict and a Config; None, after a line, when it no longer
    reads (damaged, not UTF-8, or from another version of the project)."""
    path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise UserError("not a mapping of sections")
        return config, from_dict(config)
    except FileNotFoundError:
        why = "it has none"
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except yaml.YAMLError:
        why = "not valid YAML"
    except (UserError, TypeError, ValueError) as exc:
        why = first_line(exc, 160)
    print(
        f"{run_dir.name}: skipped, its config.yaml does not read ({why}); "
        f"the other trials are reported ({path})",
        file=sys.stderr,
    )
    return None


def rank(by_group: dict[str, dict], mode: str, next_mode: str = "min") -> list[dict]:
    """One row per config, best first, ties broken by the next metric; configs without a
    result last."""
    rows = []
    for name, group in by_group.items():
        mean, std, n = aggregate(group["values"])
        tiebreak = aggregate([v for v in group.get("next", []) if v is not None])[0]
        states = sorted({t["state"] for t in group["trials"]})
        rows.append(
            {"group": name, **group, "mean": mean, "std": std, "n": n, "state": states,
             "tiebreak": tiebreak}
        )  # fmt: skip
    sign, next_sign = (-1 if m == "max" else 1 for m in (mode, next_mode))

    def key(row):
        if not row["n"]:
            return (True, 0.0, 0.0)
        nxt = row["tiebreak"]
        return (False, sign * row["mean"], math.inf if math.isnan(nxt) else next_sign * nxt)

    return sorted(rows, key=key)


def ties(rows: list[dict], order: tuple) -> list[str]:
    """A line per set of configs with the same result, saying how they were ranked."""
    metric, _, after, after_mode = order
    lines, i = [], 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[i]["n"] and rows[j]["n"] and _same(rows[i], rows[j], "mean"):
            j += 1
        if j - i > 1:
            tied = rows[i:j]
            how = f"ranked by val {after} ({after_mode})" if after else "in sweep order"
            if after and all(_same(tied[0], r, "tiebreak") for r in tied):
                how = f"they tie on val {after} too: in sweep order"
            value, names = f"{tied[0]['mean']:.4f}", ", ".join(r["group"] for r in tied)
            lines.append(f"note: {len(tied)} configs tie on {metric} ({value}); {how}: {names}")
        i = j
    return lines


def _same(a: dict, b: dict, field: str) -> bool:
    x, y = a[field], b[field]
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def _next_value(sweep_dir: Path, trial: str, best: float, order: tuple, runs: dict):
    """The next metric at the trial's best epoch (metrics.csv; at its last, from runs.csv)."""
    metric, _, after, after_mode = order
    if after is None:
        return None
    try:
        columns = read_columns(sweep_dir / trial / "metrics.csv")
    except (OSError, UnicodeDecodeError, csv.Error):
        columns = {}
    pairs = zip(columns.get(f"val/{metric}", []), columns.get(f"val/{after}", []), strict=False)
    at_best = [b for a, b in pairs if math.isclose(a, best, rel_tol=1e-9) and not math.isnan(b)]
    if at_best:
        return max(at_best) if after_mode == "max" else min(at_best)
    return cell_float(runs.get(trial, {}).get(f"val_{after}"))


def table(rows: list[dict], keys: list[str], metric: str, mode: str) -> str:
    head = ["rank", "trial", *keys, f"best val {metric} ({mode})", "runs", "state"]
    cells = []
    for i, row in enumerate(rows, 1):
        value = _pm(row) if row["n"] else "-"
        n = f"{row['n']}/{len(row['trials'])}"
        settings = [str(row["settings"].get(k, "")) for k in keys]
        cells.append([str(i), row["group"], *settings, value, n, ",".join(row["state"])])
    return markdown_table(head, cells)


def _pm(row: dict) -> str:
    return f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["n"] > 1 else "")


def _write_csv(path: Path, rows: list[dict], keys: list[str], metric: str) -> None:
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["trial", *keys, f"{metric}_mean", f"{metric}_std", "runs", "state"])
    for row in rows:
        mean, std = (f"{row['mean']:.6g}", f"{row['std']:.6g}") if row["n"] else ("", "")
        settings = [row["settings"].get(k, "") for k in keys]
        writer.writerow([row["group"], *settings, mean, std, row["n"], ",".join(row["state"])])
    locks.replace_text(path, text.getvalue())


def _write_best(sweep_dir: Path, best: dict) -> None:
    config = next(iter(best["configs"].values()))  # a trial of it whose config reads
    for section, names in NOT_IN_BEST.items():
        for name in names:
            config.get(section, {}).pop(name, None)
    config.setdefault("run", {})["name"] = f"{sweep_dir.name}-best"  # not into runs named default
    header = (
        f"# Best config of sweep {sweep_dir.name}: {best['group']} ({_pm(best)}).\n"
        "# The whole config (the sweep's --config file and settings included), so it trains\n"
        "# the same after that file changes: python scripts/train.py --config best.yaml\n"
    )
    locks.replace_text(
        sweep_dir / run_files.BEST_CONFIG, header + yaml.safe_dump(config, sort_keys=False)
    )


def plot(sweep_dir: Path, rows: list[dict], keys: list[str], metric: str) -> None:
    """metric_vs_<key>.png per swept key, where matplotlib is installed."""
    if not available():
        print(f"plots: {INSTALL_HINT} for metric_vs_<key>.png")
        return
    rows = [row for row in rows if row["n"]]
    for key in keys:
        points = sorted((_number(row["settings"][key]), row["mean"], row["std"]) for row in rows)
        fig, (ax,) = subplot_grid(1)
        fig.set_size_inches(5, 3.5)
        ax.errorbar([p[0] for p in points], [p[1] for p in points], [p[2] for p in points],
                    fmt="o")  # fmt: skip
        if key.endswith("lr") and all(isinstance(p[0], float) for p in points):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"best val {metric}")
        fig.tight_layout()
        save_figure(fig, sweep_dir / f"metric_vs_{key}.png")


def _number(value: str):
    try:
        return float(value)
    except ValueError:
        return value
