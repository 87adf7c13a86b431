"""Vector metrics (one value per class or label) through every record: metrics.csv,
TensorBoard, the summary, runs.csv, compare_runs and the reports; and their entries as
train.best_metric."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import tiny_with

from {{ cookiecutter.package_name }} import tasks
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tasks.classification import Classification
from {{ cookiecutter.package_name }}.tools import compare
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils.metrics import flatten


class PerClassHits(Classification):
    """A user's task whose summarise returns a vector: the correct predictions per class."""

    vector_metrics = ("hits",)
    metrics = {"acc": "max", "hits": "max", "loss": "min"}

    def __init__(self, opts, data, meta=None):
        super().__init__(opts, data, meta)
        self.label_names = (meta or {}).get("classes")

    def sums(self, output, y):
        right = y[output.argmax(1) == y]
        hits = torch.bincount(right, minlength=self.num_outputs).to(torch.float64)
        return {**super().sums(output, y), "hits": hits}

    def summarise(self, sums):
        return {**super().summarise(sums), "hits": torch.tensor(sums["hits"])}  # a 1-D tensor


@pytest.fixture
def hits_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "hits", PerClassHits)


def test_flatten_names_each_entry_and_leaves_scalars():
    flat = flatten({"acc": 0.5, "f1": [0.1, 0.2], "n": torch.tensor([1.0, 2.0])}, ["a", "b"])
    assert flat == {"acc": 0.5, "f1/a": 0.1, "f1/b": 0.2, "n/a": 1.0, "n/b": 2.0}
    assert flatten(flat) == flat
    assert flatten({"r": [3.0]}, ["a", "b"]) == {"r/0": 3.0}  # names of another length
    with pytest.raises(TypeError, match="'cm' is not a scalar or a 1-D vector"):
        flatten({"cm": [[1, 2], [3, 4]]})


def test_a_vector_metric_trains_and_every_record_holds_it_per_class(
    tmp_path, tiny, hits_task, capsys
):
    args = tiny_with(
        tiny,
        "task.name=hits",
        "train.epochs=1",
        "train.best_metric=hits/angle_1",
        "run.loggers=[csv,tensorboard]",
    )
    result = fit(load_config(None, args))
    names = [f"hits/angle_{c}" for c in range(4)]
    assert set(names) <= set(result["metrics"])
    run = tmp_path / "runs" / "default"
    with (run / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert {f"val/{n}" for n in names} <= set(header), header
    with (tmp_path / "runs" / "runs.csv").open() as f:
        row = next(csv.DictReader(f))
    assert float(row["best_val_hits/angle_1"]) == result["metrics"]["hits/angle_1"]
    assert {f"val_{n}" for n in names} <= set(row)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run / "tb"))
    board.Reload()
    assert {f"val/{n}" for n in names} <= set(board.Tags()["scalars"])
    printed = capsys.readouterr().out
    # The summary names the per-class metric that picks best.pt and counts the rest, which
    # metrics.csv, runs.csv and TensorBoard hold (above).
    assert "best val hits/angle_1 (max)" in printed and "hits/angle_3" not in printed
    assert "(+4 per class/label: metrics.csv" in printed
    summary = compare.summarise(run)
    assert summary["metric"] == "hits/angle_1"
    assert summary["best"] == result["metrics"]["hits/angle_1"]
    assert "best val hits/angle_1" in compare.table(["default"], [summary])
    # >>> sweeps
    from {{ cookiecutter.package_name }}.tools import sweep_report

    trial = {"id": "default", "group": "g", "settings": {}, "state": "done"}
    assert sweep_report.report(tmp_path / "runs", [trial]) == 0
    assert "best val hits/angle_1 (max)" in capsys.readouterr().out
    # <<< sweeps


@pytest.mark.parametrize(
    "metric, message",
    [
        ("hits", r"train.best_metric=hits is a vector \(one value per class\); choose one"),
        ("hits/angle_9", r"train.best_metric=hits/angle_9 is not reported for this data"),
    ],
)
def test_a_whole_vector_or_an_unknown_entry_as_best_metric_is_one_line(
    tmp_path, tiny, hits_task, metric, message
):
    args = tiny_with(tiny, "task.name=hits", f"train.best_metric={metric}")
    with pytest.raises(ConfigError, match=message):
        fit(load_config(None, args))
    assert not (tmp_path / "runs").exists()
