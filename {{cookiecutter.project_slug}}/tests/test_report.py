"""The evaluation report of scripts/evaluate.py: per-class numbers and pictures."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, ROOT, TINY, run_script
from test_distributed import STANDALONE, child_env

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tasks import build_task
from {{ cookiecutter.package_name }}.tools import report
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint, evaluate_main
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import evaluate, fit

PNG = b"\x89PNG\r\n\x1a\n"
NUM_TARGETS = SimpleNamespace(num_targets=1)


def test_per_class_numbers_match_a_hand_computation():
    # Six samples of 3 classes; true -> predicted: a->a, a->a, a->b, b->b, b->c, c->c.
    logits = torch.eye(3)[torch.tensor([0, 0, 1, 1, 2, 2])]
    y = torch.tensor([0, 0, 0, 1, 1, 2])
    collector = report.Collector("classification", 3, torch.device("cpu"))
    collector(logits[:4], y[:4])  # two batches add up
    collector(logits[4:], y[4:])
    assert collector.confusion.tolist() == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    rows = report.per_class(collector.confusion, ["a", "b", "c"])
    # a: 2 of 2 predicted a are a (precision 1), 2 of 3 a found (recall 2/3), F1 0.8.
    # b: 1 of 2 predicted b are b, 1 of 2 b found: 0.5, 0.5, 0.5.
    # c: 1 of 2 predicted c are c (0.5), the one c found (1.0): F1 2/3.
    expected = [(1.0, 2 / 3, 0.8, 3), (0.5, 0.5, 0.5, 2), (0.5, 1.0, 2 / 3, 1)]
    for row, (p, r, f1, n) in zip(rows, expected, strict=True):
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (p, r, f1, n)
        )


def test_a_class_never_predicted_has_zero_precision_not_an_error():
    rows = report.per_class(torch.tensor([[3, 0], [2, 0]]), ["a", "b"])
    assert rows[1] == {"class": "b", "precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}


@pytest.mark.slow
def test_evaluate_writes_the_report_beside_the_checkpoint(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    fit(load_config(None, tiny))
    best = Path(load_config(None, tiny).run.output_dir) / "default" / "best.pt"
    proc = run_script("scripts/evaluate.py", "--checkpoint", str(best), "--json")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    folder = best.with_name("best_report")
    saved = json.loads((folder / "report.json").read_text())
    assert [r["class"] for r in saved["per_class"]] == [f"angle_{c}" for c in range(4)]
    confusion = torch.tensor(saved["confusion_matrix"])
    assert confusion.sum() == metrics["count"] == 96
    assert confusion.trace() / 96 == pytest.approx(metrics["acc"])
    with (folder / "per_class.csv").open() as f:
        assert [int(r["support"]) for r in csv.DictReader(f)] == confusion.sum(1).tolist()
    assert (folder / "confusion_matrix.png").read_bytes().startswith(PNG)
    # The per-class numbers are those of the predictions predict.py writes for the split.
    out = tmp_path / "val.csv"
    assert predict_main(["--checkpoint", str(best), "--split", "val", "--out", str(out)]) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    a = "angle_0"
    tp = sum(r["prediction"] == a == r["label"] for r in rows)
    precision = tp / max(sum(r["prediction"] == a for r in rows), 1)
    recall = tp / sum(r["label"] == a for r in rows)
    assert (saved["per_class"][0]["precision"], saved["per_class"][0]["recall"]) == (
        pytest.approx(precision),
        pytest.approx(recall),
    )


@pytest.mark.slow
def test_regression_report_draws_predicted_against_true(demo_data, tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    output_dir = load_config(None, tiny).run.output_dir
    cfg = load_config(
        CONFIGS / "experiments" / "csv_regression.yaml",
        [
            "train.epochs=1",
            "run.device=cpu",
            "run.loggers=csv",
            f"run.output_dir={output_dir}",
        ],
    )
    fit(cfg)
    best = str(Path(output_dir) / "csv_regression" / "best.pt")
    assert evaluate_main(["--checkpoint", best, "--report", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "pred_vs_true.png").read_bytes().startswith(PNG)
    assert json.loads((tmp_path / "r" / "report.json").read_text())["metrics"]["count"] == 200


def test_regression_pairs_are_in_the_targets_units():
    """The model learns standardised targets; the predicted-vs-true picture shows the user's
    numbers: evaluate hands the collector decoded outputs."""
    meta = {"target_mean": [150.0], "target_std": [80.0]}
    task = build_task(load_config(None, ["task.name=regression"]).task, NUM_TARGETS, meta)
    model = torch.nn.Linear(1, 1)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.ones_(model.bias)  # predicts 1 in standardised units: 150 + 80 = 230
    collector = report.Collector("regression", 1, torch.device("cpu"))
    batch = (torch.zeros(4, 1), torch.full((4, 1), 230.0))
    metrics = evaluate(model, [batch], task, torch.device("cpu"), observe=collector)
    assert collector.pairs[0][0].tolist() == [[230.0]] * 4 and metrics["rmse"] == 0


def test_without_matplotlib_the_report_is_written_without_pictures(tiny, capsys, monkeypatch):
    fit(load_config(None, [*tiny, "train.max_steps=16"]))
    best = str(Path(load_config(None, tiny).run.output_dir) / "default" / "best.pt")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    capsys.readouterr()
    assert evaluate_main(["--checkpoint", best]) == 0
    out = capsys.readouterr().out
    assert "note: matplotlib is not installed" in out
    folder = Path(best).with_name("best_report")
    assert sorted(p.name for p in folder.iterdir()) == ["per_class.csv", "report.json"]


def evaluate_on_two_ranks(checkpoint: Path, report: Path) -> subprocess.CompletedProcess:
    """scripts/evaluate.py under torchrun on two gloo ranks, writing its report to `report`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *STANDALONE, "scripts/evaluate.py"]
    cmd += ["--checkpoint", str(checkpoint), "--report", str(report)]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_under_torchrun_the_report_counts_each_sample_once(tmp_path):
    # 97 validation samples: 49 + 48 on two ranks; the confusion counts are summed.
    common = [*TINY, "data.val_size=97", f"run.output_dir={tmp_path}"]
    fit(load_config(None, [*common, "train.max_steps=8"]))
    best = tmp_path / "default" / "last.pt"
    alone = evaluate_checkpoint(str(best), ["run.device=cpu"], str(tmp_path / "alone"))
    proc = evaluate_on_two_ranks(best, tmp_path / "two")
    assert proc.stdout.count("report: ") == 1  # rank 0 alone writes
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    one = json.loads((tmp_path / "alone" / "report.json").read_text())
    assert sum(map(sum, two["confusion_matrix"])) == 97 == alone["count"]
    assert two["confusion_matrix"] == one["confusion_matrix"]


@pytest.mark.slow
def test_regression_on_a_rank_without_validation_samples(tmp_path):
    """One validation row on two ranks: rank 1 sums nothing, and its named zeros (per-target
    vectors included) join rank 0's in the one all-reduce; the metrics equal one process's."""
    rows = [f"{i % 7},{i % 3},{200 + 10 * (i % 7) - 5 * (i % 3)}" for i in range(40)]
    (tmp_path / "t.csv").write_text("\n".join(["a,b,y", *rows]) + "\n")
    (tmp_path / "v.csv").write_text("a,b,y\n3,1,221\n")
    data = [f"data.path={tmp_path / 't.csv'}", f"data.val_path={tmp_path / 'v.csv'}"]
    common = ["data.name=csv", "data.label=y", "model.name=mlp", "task.name=regression"]
    common += ["train.batch_size=8", "train.epochs=1", "run.device=cpu", "run.loggers=[csv]"]
    fit(load_config(None, [*common, *data, f"run.output_dir={tmp_path}"]))
    best = tmp_path / "default" / "best.pt"
    alone = evaluate_checkpoint(str(best), ["run.device=cpu"])
    evaluate_on_two_ranks(best, tmp_path / "two")
    two = json.loads((tmp_path / "two" / "report.json").read_text())["metrics"]
    assert two["count"] == alone["count"] == 1
    for key in ("loss", "rmse", "mae"):
        assert two[key] == pytest.approx(alone[key], rel=1e-9), key


@pytest.mark.slow
def test_a_report_cut_short_leaves_the_earlier_one_whole(tiny, tmp_path, monkeypatch):
    """A kill while the report is written (here: while its picture is drawn) leaves the
    earlier report as it was, never report.json of one checkpoint beside the picture of
    another; the next evaluation replaces it whole."""
    pytest.importorskip("matplotlib")
    fit(load_config(None, tiny))
    run = Path(load_config(None, tiny).run.output_dir) / "default"
    first, second = sorted(run.glob("step-*.pt"))  # the two epochs
    folder = tmp_path / "report"
    assert evaluate_main(["--checkpoint", str(first), "--report", str(folder)]) == 0
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def killed(*args):
        raise KeyboardInterrupt  # as a kill: the drawing never finishes

    monkeypatch.setattr(report, "_confusion_png", killed)
    assert evaluate_main(["--checkpoint", str(second), "--report", str(folder)]) == 130
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "runs"]  # no staging left
    monkeypatch.undo()
    assert evaluate_main(["--checkpoint", str(second), "--report", str(folder)]) == 0
    saved = json.loads((folder / "report.json").read_text())
    assert saved["metrics"]["checkpoint"] == str(second)
    assert sorted(p.name for p in folder.iterdir()) == sorted(before)
