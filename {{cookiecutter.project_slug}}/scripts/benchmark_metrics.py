"""Measure what classification's validation metrics cost against an epoch of training: the
confusion matrix, the per-class metrics and, for two classes, the gathered scores of the
exact AUROC, average precision and tuned threshold; and the multi-label task's (each label's # feature: multilabel
scores gathered and sorted, the decisions' counts, exact match). # feature: multilabel
exact AUROC, average precision and tuned threshold. # feature: !multilabel

    python scripts/benchmark_metrics.py                   # default CNN + a 10^5-row table
    python scripts/benchmark_metrics.py --rows 20000 --steps 10 --json

Three cases: the default config (the CNN on synthetic images, 10 classes), an MLP on a # feature: multilabel
table of --rows rows, 10 % positives (two classes: ranking metrics too), and an MLP on a table # feature: multilabel
of --rows rows with 8 tags (multi-label, thresholds tuned), as training builds them # feature: multilabel
Two cases: the default config (the CNN on synthetic images, 10 classes) and an MLP on a # feature: !multilabel
table of --rows rows, 10 % positives (two classes: ranking metrics too), as training builds them # feature: !multilabel
(trainer.build_loaders). The epoch's time is --steps timed optimizer steps
(after two warm-up steps) times the steps of an epoch. The metrics' cost is the time of the
task's sums over the whole validation split, combined as validation does (validation.Totals),
plus its summarise, on model outputs computed
beforehand (the forward pass is there with or without the metrics), less the same for the
sums the task had before (loss, correct, count; multi-label: loss and count): the `extra` # feature: multilabel
sums the task had before (loss, correct, count): the `extra` # feature: !multilabel
share is what the new metrics add, `all` what every validation metric costs. Timings are
medians of --repeats.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

try:
    from {{ cookiecutter.package_name }} import config, trainer
    from {{ cookiecutter.package_name }}.distributed import DistInfo
    from {{ cookiecutter.package_name }}.models import build_model
    from {{ cookiecutter.package_name }}.tools.cli import Parser
    from {{ cookiecutter.package_name }}.utils.device import resolve_device, sums_dtype
    from {{ cookiecutter.package_name }}.validation import Totals
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)


def write_table(path: Path, rows: int) -> Path:
    g = torch.Generator().manual_seed(0)
    positive = torch.rand(rows, generator=g) < 0.1
    x = torch.randn(rows, 20, generator=g) + positive[:, None].float()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(f"x{i}" for i in range(20)), "label"])
        for row, p in zip(x.tolist(), positive.tolist(), strict=True):
            writer.writerow([f"{v:.4f}" for v in row] + ["yes" if p else "no"])
    return path


# >>> multilabel
def write_tags(path: Path, rows: int) -> Path:
    """A multi-label table: 8 tags, each present at its own rate (5 % to 40 %)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 20, generator=g)
    rates = torch.linspace(0.05, 0.4, 8)
    tags = (x[:, :8] + torch.randn(rows, 8, generator=g)) > torch.distributions.Normal(
        0, 2**0.5
    ).icdf(1 - rates)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(f"x{i}" for i in range(20)), "tags"])
        for row, on in zip(x.tolist(), tags.tolist(), strict=True):
            joined = "|".join(f"t{i}" for i, t in enumerate(on) if t)
            writer.writerow([f"{v:.4f}" for v in row] + [joined])
    return path
# <<< multilabel


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def old_sums(output: torch.Tensor, y: torch.Tensor) -> dict:
    """What classification summed before the per-class metrics: the baseline."""
    wide = sums_dtype(y.device)
    return {
        "loss": F.cross_entropy(output.float(), y, reduction="sum").to(wide),
        "correct": (output.argmax(1) == y).sum().to(wide),
        "count": torch.full((), len(y), dtype=wide, device=y.device),
    }


# >>> multilabel
def bce_sums(output: torch.Tensor, y: torch.Tensor) -> dict:
    """A multi-label task's loss and count alone: the baseline of its metrics."""
    wide = sums_dtype(y.device)
    loss = F.binary_cross_entropy_with_logits(output.float(), y.float(), reduction="sum")
    return {"loss": loss.to(wide), "count": torch.full((), len(y), dtype=wide, device=y.device)}
# <<< multilabel


def validation_time(task, batches, device) -> float:
    """Seconds to combine the task's sums over the batches and turn them into metrics, as
    validation.evaluate does (validation.Totals)."""
    _sync(device)
    start = time.perf_counter()
    totals = Totals(task, device)
    for output, y in batches:
        totals.add(task.sums(output, y), output)
    totals.metrics()
    return time.perf_counter() - start


def measure(name: str, cfg, steps: int, repeats: int) -> dict:
    device = resolve_device(cfg.run.device)
    data = trainer.build_loaders(cfg, DistInfo(), device)
    model = build_model(cfg.model, data.example, data.task.num_outputs).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    batches = iter(data.train_loader)
    timed = []
    for step in range(steps + 2):  # two warm-up steps
        x, y = (t.to(device) for t in next(batches))
        _sync(device)
        start = time.perf_counter()
        data.task.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        if step >= 2:
            timed.append(time.perf_counter() - start)
    epoch_s = statistics.median(timed) * data.steps_per_epoch
    with torch.no_grad():
        model.eval()
        outputs = [(model(x.to(device)), y.to(device)) for x, y in data.val_loader]
    task = data.task
    new = statistics.median(validation_time(task, outputs, device) for _ in range(repeats))
    baseline = bce_sums if task.targets == "labels" else old_sums  # feature: multilabel
    baseline = old_sums  # feature: !multilabel
    before = SimpleNamespace(sums=baseline, summarise=lambda sums: sums)
    old = statistics.median(validation_time(before, outputs, device) for _ in range(repeats))
    return {
        "case": name,
        "device": str(device),
        "classes": task.num_outputs,
        "val_samples": len(data.val_set),
        "epoch_s": epoch_s,
        "metrics_s": new,
        "baseline_s": old,
        "extra_share": max(new - old, 0.0) / epoch_s,
        "all_share": new / epoch_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the table case")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per case")
    parser.add_argument("--repeats", type=int, default=5, help="timings of the metrics")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("overrides", nargs="*", help="key=value settings for both cases")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        table = write_table(Path(folder) / "table.csv", args.rows)
        tags = write_tags(Path(folder) / "tags.csv", args.rows)  # feature: multilabel
        cases = {
            "default CNN": config.load_config(None, args.overrides),
            f"{args.rows}-row table, MLP": config.load_config(
                None,
                [
                    "data.name=csv",
                    f"data.path={table}",
                    "data.label=label",
                    "model.name=mlp",
                    *args.overrides,
                ],
            ),
            # >>> multilabel
            f"{args.rows}-row multi-label table (8 labels), MLP": config.load_config(
                None,
                [
                    "data.name=csv",
                    f"data.path={tags}",
                    "data.label=tags",
                    "task.name=multilabel",
                    "task.threshold=auto",
                    "model.name=mlp",
                    *args.overrides,
                ],
            ),
            # <<< multilabel
        }
        results = [measure(name, cfg, args.steps, args.repeats) for name, cfg in cases.items()]
    if args.json:
        print(json.dumps({"results": results}))
        return 0
    for r in results:
        print(
            f"{r['case']} ({r['classes']} classes, {r['val_samples']} val samples, "
            f"{r['device']}): epoch {r['epoch_s']:.2f} s; validation metrics "
            f"{1e3 * r['metrics_s']:.1f} ms (before: {1e3 * r['baseline_s']:.1f} ms) = "
            f"{100 * r['extra_share']:.3f} % of an epoch added, "
            f"{100 * r['all_share']:.3f} % in all"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
