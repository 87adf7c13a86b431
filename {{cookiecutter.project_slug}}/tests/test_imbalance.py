"""Imbalanced classification: the per-class metrics agree with scikit-learn from sums over
uneven parts, class weights (none, auto, a list, a mapping) reach the loss and the
checkpoint, the threshold is tuned on validation and used by the tools, and any of the new
metrics picks best.pt."""

from __future__ import annotations

import csv
import json  # feature: export
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_with
from test_tasks import in_parts, task

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils.metrics import flatten


def skewed(k: int, n: int = 500, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, k) and targets with the first class frequent and the others rare."""
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(torch.tensor([8.0] + [1.0] * (k - 1)), n, True, generator=g)
    logits = torch.randn(n, k, generator=g) + 1.5 * F.one_hot(y, k)
    return logits, y


@pytest.mark.parametrize("k", [2, 3])
def test_classification_metrics_match_sklearn_from_sums_over_uneven_parts(k):
    metrics = pytest.importorskip("sklearn.metrics")
    logits, y = skewed(k)
    got = flatten(in_parts(task("classification", num_classes=k), logits, y, cuts=(7, 250)))
    pred = logits.argmax(1).numpy()
    assert got["acc"] == pytest.approx(metrics.accuracy_score(y, pred))
    assert got["macro_f1"] == pytest.approx(metrics.f1_score(y, pred, average="macro"))
    assert got["balanced_acc"] == pytest.approx(metrics.balanced_accuracy_score(y, pred))
    for name, fn in [("precision", metrics.precision_score), ("recall", metrics.recall_score)]:
        want = fn(y, pred, average=None, zero_division=0)
        assert [got[f"{name}/{c}"] for c in range(k)] == pytest.approx(want.tolist())
    want = metrics.f1_score(y, pred, average=None)
    assert [got[f"f1/{c}"] for c in range(k)] == pytest.approx(want.tolist())
    if k == 2:
        p = logits.softmax(1)[:, 1].numpy()
        assert got["auroc"] == pytest.approx(metrics.roc_auc_score(y, p), abs=1e-3)
        assert got["ap"] == pytest.approx(metrics.average_precision_score(y, p), abs=1e-3)
    else:
        assert "auroc" not in got and "ap" not in got


def test_class_weights_reach_the_loss_and_the_reported_loss_stays_plain():
    logits, y = skewed(3, n=64)
    plain = task("classification", num_classes=3, classes=["a", "b", "c"])
    for option, weights in [
        ("task.class_weights=[1,1,10]", [1.0, 1.0, 10.0]),  # repeats kept (a list of names
        ("task.class_weights={c: 4, a: 1, b: 2}", [1.0, 2.0, 4.0]),  # drops them)
        ("task.class_weights=auto", [128 / (3 * 100), 128 / (3 * 20), 128 / (3 * 8)]),
    ]:
        weighted = task(
            "classification", option, meta={"class_counts": [100, 20, 8]}, num_classes=3,
            classes=["a", "b", "c"],
        )  # fmt: skip
        # Each sample's loss times its class's weight, over the samples: two halves (ranks,
        # micro-batches) average to the whole batch's loss.
        want = (torch.tensor(weights)[y] * F.cross_entropy(logits, y, reduction="none")).mean()
        assert weighted.loss(logits, y).item() == pytest.approx(want.item(), rel=1e-6), option
        halves = (weighted.loss(logits[:32], y[:32]) + weighted.loss(logits[32:], y[32:])) / 2
        assert halves.item() == pytest.approx(want.item(), rel=1e-6)
        assert in_parts(weighted, logits, y)["loss"] == in_parts(plain, logits, y)["loss"]


@pytest.mark.parametrize(
    "option, message",
    [
        ("task.class_weights=[1,2]", r"has 2 weights for the 3 classes \['a', 'b', 'c'\]"),
        ("task.class_weights={a: 1, b: 2, d: 3}", r"\['d'\] are not classes"),
        ("task.class_weights={a: 1, b: 2}", r"\['c'\] have no weight"),
        ("task.class_weights=auto", "needs the training split's class counts"),
        ("task.threshold=0.3", "task.threshold=0.3 decides between two classes"),
    ],
)
def test_class_weights_that_do_not_fit_the_classes_are_one_line(option, message):
    with pytest.raises(ConfigError, match=message):
        task("classification", option, num_classes=3, classes=["a", "b", "c"])


@pytest.mark.parametrize(
    "option", ["task.class_weights=[1,-1]", "task.class_weights=often", "task.threshold=1.5"]
)
def test_bad_class_weights_or_threshold_values_are_refused_by_the_config(option):
    with pytest.raises(ConfigError, match=option.split("=")[0].split(".")[1]):
        load_config(None, [option])


def test_threshold_auto_tunes_f1_on_validation_and_records_it_in_the_data_meta():
    logits, y = skewed(2, n=2000)
    meta = {}
    tuned = task("classification", "task.threshold=auto", meta=meta, num_classes=2)
    fixed = task("classification", num_classes=2)
    auto, half = in_parts(tuned, logits, y), in_parts(fixed, logits, y)
    t = auto["threshold"]
    assert meta["tuned"] == {"threshold": t, "positives": y.sum().item()}
    assert half["threshold"] == 0.5 and t != 0.5
    f1 = [flatten(m)["f1/1"] for m in (auto, half)]
    assert f1[0] > f1[1]
    decided = (logits.softmax(1)[:, 1] >= t).long()  # the rule the tools apply
    tp = ((decided == 1) & (y == 1)).sum().item()
    assert f1[0] == pytest.approx(2 * tp / (decided.sum().item() + y.sum().item()))
    # The task of a checkpoint (evaluate, predict) decides with the saved threshold.
    saved = task("classification", "task.threshold=auto", meta=meta, num_classes=2)
    assert saved.threshold == t and torch.equal(saved.decide(logits.softmax(1)), decided)


def imbalanced_table(path, n: int = 800) -> None:
    g = torch.Generator().manual_seed(1)
    fraud = torch.rand(n, generator=g) < 0.1
    rows = torch.randn(n, 6, generator=g) + 1.5 * fraud[:, None]
    lines = ["a,b,c,d,e,f,fraud"] + [
        ",".join(f"{v:.4f}" for v in row) + ("," + ("yes" if f else "no"))
        for row, f in zip(rows.tolist(), fraud.tolist(), strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow  # trains, evaluates, predicts, exports  # feature: export
@pytest.mark.slow  # trains, evaluates, predicts  # feature: !export
def test_an_imbalanced_table_trains_by_macro_f1_and_every_tool_uses_its_threshold(
    tmp_path, tiny, capsys
):
    table = tmp_path / "fraud.csv"
    imbalanced_table(table)
    args = tiny_with(
        tiny,
        "data.name=csv",
        f"data.path={table}",
        "data.label=fraud",
        "model.name=mlp",
        "model.width=16",
        "task.class_weights=auto",
        "task.threshold=auto",
        "train.best_metric=macro_f1",
        "train.epochs=3",
    )
    result = fit(load_config(None, args))
    run = tmp_path / "runs" / "default"
    best = checkpoint.load(run / "best.pt")
    counts = best["data"]["class_counts"]
    assert sum(counts) == 720 and counts[1] < counts[0] / 4  # the 90 % training rows
    threshold = best["data"]["tuned"]["threshold"]
    assert 0 < threshold < 1
    evaluated = evaluate_checkpoint(str(run / "best.pt"))
    assert evaluated["threshold"] == threshold and evaluated["macro_f1"] == result["best"]
    with (run / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert {"val/macro_f1", "val/auroc", "val/ap", "val/f1/yes", "val/recall/no"} <= set(header)
    out = tmp_path / "predictions.csv"
    predict(str(run / "best.pt"), [str(table)], out=str(out))
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["input", "prediction", "probability", "prob_no", "prob_yes"]
    for row in rows:
        p = np.array([float(row["prob_no"]), float(row["prob_yes"])])
        assert p.sum() == pytest.approx(1, abs=2e-6)
        assert row["prediction"] == ("yes" if p[1] >= threshold else "no")
        assert float(row["probability"]) == p[int(row["prediction"] == "yes")]
    assert any(float(r["prob_yes"]) < 0.5 and r["prediction"] == "yes" for r in rows) or any(
        float(r["prob_yes"]) >= 0.5 and r["prediction"] == "no" for r in rows
    )  # the tuned threshold, not 0.5, decided
    # >>> export
    assert export_main(["--checkpoint", str(run / "best.pt"), "--format", "export"]) == 0
    exported = json.loads((run / "best.pt2.json").read_text())
    assert exported["threshold"] == threshold and exported["classes"] == ["no", "yes"]
    # <<< export
    # A resume that changes the class weights is refused; the run's files stay as they were.
    capsys.readouterr()
    with pytest.raises(ConfigError, match="task.class_weights=none differs"):
        fit(load_config(None, [*args, "train.epochs=4", "train.resume=auto",
                               "task.class_weights=none"]))  # fmt: skip


@pytest.mark.slow
def test_a_checkpoint_without_the_new_meta_still_evaluates(tmp_path, tiny):
    """Checkpoints from before class counts, tuned thresholds and the new options: the
    defaults (no weights, threshold 0.5) and the same metrics."""
    result = fit(load_config(None, [*tiny, "train.epochs=1"]))
    path = tmp_path / "runs" / "default" / "best.pt"
    state = checkpoint.load(path)
    for key in ("class_counts", "tuned"):
        state["data"].pop(key, None)
    for key in ("class_weights", "threshold"):
        del state["config"]["task"][key]
    torch.save(state, tmp_path / "old.pt")
    metrics = evaluate_checkpoint(str(tmp_path / "old.pt"))
    assert metrics["acc"] == result["metrics"]["acc"] and "f1/angle_0" in metrics


@pytest.mark.parametrize("metric", ["balanced_acc", "macro_f1", "f1/angle_2", "loss"])
def test_any_scalar_or_a_class_entry_picks_best_pt_with_its_own_direction(tmp_path, tiny, metric):
    result = fit(load_config(None, [*tiny, f"train.best_metric={metric}"]))
    with (tmp_path / "runs" / "default" / "metrics.csv").open() as f:
        values = [float(row[f"val/{metric}"]) for row in csv.DictReader(f)]
    want = min(values) if metric == "loss" else max(values)
    assert result["best"] == pytest.approx(want, rel=1e-5)  # metrics.csv: 6 digits


def test_auroc_of_more_than_two_classes_is_refused_before_anything_is_written(tmp_path, tiny):
    with pytest.raises(ConfigError, match="train.best_metric=auroc is not reported"):
        fit(load_config(None, [*tiny, "train.best_metric=auroc"]))
    assert not (tmp_path / "runs").exists()


def test_a_threshold_tuned_on_few_positives_says_so_once_with_the_fix(tmp_path, capsys):
    from test_test_split import table_run, write_rare

    table = write_rare(tmp_path / "small.csv", 90, 0)  # ~11 positives: 1 or 2 in validation
    fit(load_config(None, table_run(tmp_path, f"data.path={table}", "task.threshold=auto")))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "was tuned on" in line]
    assert len(lines) == 1 and "data.val_fraction" in lines[0], out  # once, not per epoch
    tuned = checkpoint.load(tmp_path / "runs" / "default" / "last.pt")["data"]["tuned"]
    assert f"tuned on {tuned['positives']} positive(s)" in lines[0] and tuned["positives"] < 10


def test_a_best_metric_that_is_nan_is_said_once_instead_of_silently_keeping_epoch_one():
    from {{ cookiecutter.package_name }}.validation import notes

    said, quiet = set(), SimpleNamespace()
    metrics = {"auroc": float("nan"), "loss": 0.3}
    (line,) = notes(quiet, metrics, "auroc", said)
    assert "val auroc is nan" in line and "train.best_metric" in line
    assert (
        notes(quiet, metrics, "auroc", said) == [] and notes(quiet, metrics, "loss", set()) == []
    )
