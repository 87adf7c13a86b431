"""A sweep's results: each trial's best validation metric (from <sweep dir>/runs.csv, else its
last checkpoint), mean ± std over the seeds/folds of a config, a markdown table ranked by it,
results.csv, best.yaml (the best trial's whole config, for --config) and metric_vs_<key>.png."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import yaml

from ..config import from_dict
from ..utils.plots import INSTALL_HINT, available, save_figure, subplot_grid

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
    metric, mode = None, "max"
    by_group: dict[str, dict] = {}
    for trial in trials:
        group = by_group.setdefault(
            trial["group"], {"settings": trial["settings"], "values": [], "trials": []}
        )
        group["trials"].append(trial)
        config = _run_config(sweep_dir / trial["id"])
        if trial["state"] != "done" or config is None:
            continue
        metric, mode = from_dict(config).best()
        value = best_value(sweep_dir, trial["id"], metric, runs)
        if value is not None:
            group["values"].append(value)
    if metric is None:
        print(f"no finished trial in {sweep_dir} yet")
        return 1
    rows = rank(by_group, mode)
    keys = list(dict.fromkeys(k for g in by_group.values() for k in g["settings"]))
    print(table(rows, keys, metric, mode))
    _write_csv(sweep_dir / "results.csv", rows, keys, metric)
    best = rows[0]
    if best["n"]:
        _write_best(sweep_dir, best)
        print(f"best: {best['group']}; its config: {sweep_dir / 'best.yaml'}")
    plot(sweep_dir, rows, keys, metric)
    return 0


def rank(by_group: dict[str, dict], mode: str) -> list[dict]:
    """One row per config, best first; configs without a result last."""
    rows = []
    for name, group in by_group.items():
        mean, std, n = aggregate(group["values"])
        states = sorted({t["state"] for t in group["trials"]})
        rows.append({"group": name, **group, "mean": mean, "std": std, "n": n, "state": states})
    sign = -1 if mode == "max" else 1
    return sorted(rows, key=lambda r: (r["n"] == 0, sign * r["mean"] if r["n"] else 0))


def table(rows: list[dict], keys: list[str], metric: str, mode: str) -> str:
    head = ["rank", "trial", *keys, f"best val {metric} ({mode})", "runs", "state"]
    cells = []
    for i, row in enumerate(rows, 1):
        value = _pm(row) if row["n"] else "-"
        n = f"{row['n']}/{len(row['trials'])}"
        settings = [str(row["settings"].get(k, "")) for k in keys]
        cells.append([str(i), row["group"], *settings, value, n, ",".join(row["state"])])
    return markdown_table(head, cells)


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _pm(row: dict) -> str:
    return f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["n"] > 1 else "")


def _write_csv(path: Path, rows: list[dict], keys: list[str], metric: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", *keys, f"{metric}_mean", f"{metric}_std", "runs", "state"])
        for row in rows:
            mean, std = (f"{row['mean']:.6g}", f"{row['std']:.6g}") if row["n"] else ("", "")
            settings = [row["settings"].get(k, "") for k in keys]
            writer.writerow([row["group"], *settings, mean, std, row["n"], ",".join(row["state"])])
    tmp.replace(path)


def _write_best(sweep_dir: Path, best: dict) -> None:
    done = [t for t in best["trials"] if t["state"] == "done"]
    config = _run_config(sweep_dir / done[0]["id"])
    for section, names in NOT_IN_BEST.items():
        for name in names:
            config.get(section, {}).pop(name, None)
    config.setdefault("run", {})["name"] = f"{sweep_dir.name}-best"  # not into runs named default
    tmp = sweep_dir / ".best.yaml.tmp"
    header = (
        f"# Best config of sweep {sweep_dir.name}: {best['group']} ({_pm(best)}).\n"
        "# The whole config (the sweep's --config file and settings included), so it trains\n"
        "# the same after that file changes: python scripts/train.py --config best.yaml\n"
    )
    tmp.write_text(header + yaml.safe_dump(config, sort_keys=False))
    tmp.replace(sweep_dir / "best.yaml")


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


def runs_table(sweep_dir: Path) -> dict[str, dict]:
    """<sweep_dir>/runs.csv (any output folder's) as {run name: row}."""
    path = sweep_dir / "runs.csv"
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {row["run"]: row for row in csv.DictReader(f)}


def _run_config(run_dir: Path) -> dict | None:
    path = run_dir / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def best_value(sweep_dir: Path, trial: str, metric: str, runs: dict) -> float | None:
    """The best validation value of run <sweep_dir>/<trial>: its row of runs.csv (`runs`,
    from runs_table), else its last checkpoint's."""
    value = runs.get(trial, {}).get(f"best_val_{metric}")
    if value:
        return float(value)
    last = sweep_dir / trial / "last.pt"
    if not last.exists():
        return None
    from ..checkpoint import load  # torch: only for runs that never wrote their row

    best = load(last).get("progress", {}).get("best")
    return None if best is None else float(best)
