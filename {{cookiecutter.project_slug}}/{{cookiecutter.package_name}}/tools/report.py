"""The evaluation report that scripts/evaluate.py writes beside the checkpoint, in
<checkpoint stem>_report/: report.json (the metrics, and per class: precision, recall, F1,
support, and the confusion matrix; multi-label: per label, with its average precision and # feature: multilabel
its 2 x 2 counts), per_class.csv, and a picture: confusion_matrix.png for a classifier, # feature: multilabel
support, and the confusion matrix), per_class.csv, and a picture: confusion_matrix.png for a # feature: !multilabel
classifier, # feature: !multilabel
pred_vs_true.png for regression. matplotlib is optional: without it the pictures
are skipped with a one-line note.

Under torchrun every rank sees its shard: a classifier's confusion counts are all-reduced as
sums, regression predictions are gathered to rank 0.

The folder is written whole: its files go to a hidden staging folder beside it
(.<name>.tmp<pid>/, removed by the next start if a kill left it), which then replaces the
earlier report by a rename, so its files never describe two checkpoints.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import torch

from .. import distributed
from ..errors import UserError
from ..tasks.classification import from_confusion
from ..utils import locks
from ..utils.plots import INSTALL_HINT, available, save_figure
from . import cli, outputs

FILES = ("report.json", "per_class.csv", "confusion_matrix.png", "pred_vs_true.png")


class Collector:
    """Passed to validation.evaluate as `observe`: collects what the report needs, batch by
    batch (on the device for a classifier: no copy per batch). evaluate hands it outputs in
    the targets' units (task.decode), so regression pairs are the user's numbers."""

    def __init__(self, task: str, num_outputs: int, device: torch.device, decide=None):
        """`decide(probabilities)`: the task's class decision (classification's threshold
        for two classes); the most probable class without it."""
        self.task, self.k, self.decide = task, num_outputs, decide
        shape = (num_outputs, 2, 2) if task == "multilabel" else (num_outputs, num_outputs)  # feature: multilabel
        shape = (num_outputs, num_outputs)  # feature: !multilabel
        self.confusion = torch.zeros(shape, dtype=torch.int64, device=device)
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # regression (pred, true)

    def __call__(self, output: torch.Tensor, y: torch.Tensor) -> None:
        if self.task == "classification":
            pred = self.decide(output.float().softmax(-1)) if self.decide else output.argmax(-1)
            cells = torch.bincount(y * self.k + pred, minlength=self.k * self.k)
            self.confusion += cells.view(self.k, self.k)  # rows: true class, columns: predicted
        # >>> multilabel
        elif self.task == "multilabel":  # output: probabilities; [label, true, predicted]
            pred, label = self.decide(output.float()), torch.arange(self.k, device=y.device)
            cells = torch.bincount(
                (label * 4 + y.long() * 2 + pred).flatten(), minlength=4 * self.k
            )
            self.confusion += cells.view(self.k, 2, 2)
        # <<< multilabel
        elif self.task == "regression":
            self.pairs.append(
                (output.float().view(len(y), -1).cpu(), y.float().view(len(y), -1).cpu())
            )

    def finish(self) -> None:
        """Combine the ranks' collections (a collective: every rank calls it)."""
        distributed.all_reduce_sum(self.confusion)
        if self.task == "regression":
            gathered = [
                pair for rank in distributed.all_gather_object(self.pairs) for pair in rank
            ]
            self.pairs = gathered


def per_class(confusion: torch.Tensor, classes: list[str]) -> list[dict]:
    """Precision, recall, F1 and support of each class from a confusion matrix whose rows are
    the true classes and columns the predicted ones: the task's own formulas (0 where a ratio
    has no denominator), so the report's numbers are the metrics'."""
    scores = from_confusion(confusion.double())
    support = confusion.sum(1).tolist()
    return [
        {
            "class": name,
            "precision": scores["precision"][i],
            "recall": scores["recall"][i],
            "f1": scores["f1"][i],
            "support": int(support[i]),
        }
        for i, name in enumerate(classes)
    ]


# >>> multilabel
def per_label(confusion: torch.Tensor, labels: list[str], metrics: dict) -> list[dict]:
    """Precision, recall, F1, average precision and support (positives) of each label from
    its 2 x 2 counts [true, predicted] at the task's thresholds and the metrics' AP."""
    rows = []
    for name, cells in zip(labels, confusion.double(), strict=True):
        tp, fp, fn = cells[1, 1].item(), cells[0, 1].item(), cells[1, 0].item()
        rows.append(
            {
                "label": name,
                "precision": tp / (tp + fp) if tp + fp else 0.0,
                "recall": tp / (tp + fn) if tp + fn else 0.0,
                "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
                "ap": metrics.get(f"ap/{name}", float("nan")),
                "support": int(tp + fn),
            }
        )
    return rows
# <<< multilabel


def _write_table(path: Path, rows: list[dict]) -> None:
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    locks.replace_text(path, table.getvalue())


def is_report(folder: Path) -> bool:
    """Whether `folder` is a report this tool wrote: report.json and other report files only."""
    try:
        names = {path.name for path in folder.iterdir()}
        return (
            "report.json" in names
            and names <= set(FILES)
            and ("metrics" in json.loads((folder / "report.json").read_text("utf-8")))
        )
    except (OSError, ValueError, TypeError):
        return False


def check_folder(folder: Path, checkpoint: str) -> None:
    """Where --report may go: never a run's folder or file; a new or empty folder, or an
    earlier report (replaced whole, so a folder holding anything else is refused: no --force
    would make that safe). Also removes what a killed report left beside it."""
    outputs.refuse_run_file(folder, "--report")
    outputs.refuse_input(folder, [checkpoint], "--report")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--report {str(folder)!r} is a file; give a folder for the report")
    if folder.is_dir() and any(folder.iterdir()) and not is_report(folder):
        raise UserError(
            f"--report {str(folder)!r} holds other files than an evaluation report, and the "
            "report replaces its folder whole; choose a new or empty folder"
        )
    outputs.remove_stale(folder)


def write(
    out_dir: Path, metrics: dict, collector: Collector, classes: list[str] | None
) -> list[str]:
    """Write the report whole: into a staging folder beside `out_dir`, which then replaces
    it; returns lines to print (where it went, notes)."""
    staged = outputs.staging(out_dir)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        notes = _write_files(staged, metrics, collector, classes)
        cli.placing_output()  # a stop signal from here waits: the folder is swapped whole
        _replace_folder(staged, out_dir)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return [f"report: {out_dir}", *notes]


def _replace_folder(staged: Path, out_dir: Path) -> None:
    """`staged` renamed to `out_dir`; an earlier report there goes aside first (a rename
    cannot replace a folder that holds files) and is removed after."""
    old = staged.with_name(f"{staged.name}.old")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        os.replace(out_dir, old)
    os.replace(staged, out_dir)
    locks.fsync_dir(out_dir.parent)
    shutil.rmtree(old, ignore_errors=True)


def _write_files(
    out_dir: Path, metrics: dict, collector: Collector, classes: list[str] | None
) -> list[str]:
    """The report's files in `out_dir`; returns notes to print."""
    report: dict = {"metrics": metrics}
    if collector.task == "classification":
        names = classes or [str(i) for i in range(collector.k)]
        rows = per_class(collector.confusion.cpu(), names)
        report["per_class"] = rows
        scores = from_confusion(collector.confusion.cpu().double())  # as the metrics' macro_f1
        report["macro_avg"] = {
            key: scores[f"macro_{key}"] for key in ("precision", "recall", "f1")
        }
        report["confusion_matrix"] = collector.confusion.cpu().tolist()
        _write_table(out_dir / "per_class.csv", rows)
    # >>> multilabel
    if collector.task == "multilabel":
        names = classes or [str(i) for i in range(collector.k)]
        rows = per_label(collector.confusion.cpu(), names, metrics)
        report["per_label"] = rows
        report["label_confusion"] = collector.confusion.cpu().tolist()  # [label][true][pred]
        _write_table(out_dir / "per_class.csv", rows)
    # <<< multilabel
    locks.replace_text(out_dir / "report.json", json.dumps(report, indent=2))
    if not available():
        return [f"note: matplotlib is not installed; no pictures ({INSTALL_HINT})"]
    split = metrics.get("split") or ("--data" if "data" in metrics else "validation")
    if collector.task == "classification":
        path = out_dir / "confusion_matrix.png"
        _confusion_png(collector.confusion.cpu(), names, path, split)
    elif collector.task == "regression" and collector.pairs:
        pred = torch.cat([p for p, _ in collector.pairs])
        true = torch.cat([t for _, t in collector.pairs])
        _scatter_png(pred, true, out_dir / "pred_vs_true.png", split)
    return []


def _figure(width: float, height: float):
    """One axes on a headless figure (utils/plots.py: no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _confusion_png(confusion: torch.Tensor, names: list[str], path: Path, split: str) -> None:
    k = len(names)
    fig, ax = _figure(min(3 + 0.5 * k, 16), min(2.5 + 0.5 * k, 15))
    image = ax.imshow(confusion.numpy(), cmap="Blues")
    fig.colorbar(image, ax=ax)
    if k <= 40:  # beyond that, names and counts would be unreadable
        ax.set_xticks(range(k), names, rotation=90)
        ax.set_yticks(range(k), names)
    if k <= 15:
        top = int(confusion.max())
        for i in range(k):
            for j in range(k):
                value = int(confusion[i, j])
                colour = "white" if value > top / 2 else "black"
                ax.text(j, i, value, ha="center", va="center", color=colour, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix ({split})")
    fig.tight_layout()
    save_figure(fig, path)


def _scatter_png(pred: torch.Tensor, true: torch.Tensor, path: Path, split: str) -> None:
    fig, ax = _figure(5, 5)
    for t in range(pred.shape[1]):
        ax.scatter(true[:, t].numpy(), pred[:, t].numpy(), s=6, alpha=0.5, label=f"target {t}")
    low, high = float(min(pred.min(), true.min())), float(max(pred.max(), true.max()))
    ax.plot([low, high], [low, high], "k--", linewidth=1)  # perfect predictions
    ax.set_xlabel("true")
    ax.set_ylabel("predicted")
    ax.set_title(f"predicted vs true ({split})")
    if pred.shape[1] > 1:
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
