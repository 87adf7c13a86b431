"""Multi-label classification: the metrics agree with scikit-learn from sums over uneven
parts, pos_weight (none, auto, a list, a mapping) reaches the loss, the thresholds are tuned
per label on validation and used by evaluate and predict; a table's labels are read from
several 0/1 columns or one joined column, tensor files' from a 0/1 float y; and a run
trains, evaluates and predicts."""  # feature: !export
trains, evaluates, predicts and exports with the sigmoid inside the artifact."""  # feature: export

from __future__ import annotations

import csv
import json  # feature: export
import re
import warnings

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

hypothesis = pytest.importorskip("hypothesis")
st, given, settings = hypothesis.strategies, hypothesis.given, hypothesis.settings

LABELS = ["beach", "dog", "people", "sunset"]


def tagged(n: int = 600, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, 4) and 0/1 targets at rates 40 % to 5 %, the logits informative."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, 4, generator=g) < torch.tensor([0.4, 0.25, 0.1, 0.05])).float()
    return torch.randn(n, 4, generator=g) + 2.0 * y - 1.0, y


def sklearn_multilabel(truth, p, thresholds) -> dict:
    """scikit-learn's multi-label metrics of probabilities `p` decided at `thresholds`."""
    metrics = pytest.importorskip("sklearn.metrics")
    pred = (p >= np.float32(thresholds)).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # labels without positives: sklearn warns, gives 0
        want = {
            "micro_f1": metrics.f1_score(truth, pred, average="micro", zero_division=0),
            "macro_f1": metrics.f1_score(truth, pred, average="macro", zero_division=0),
            "exact_match": metrics.accuracy_score(truth, pred),
            "map": metrics.average_precision_score(truth, p, average="macro"),
        }
        ap = metrics.average_precision_score(truth, p, average=None)
        want |= {f"ap/{i}": v for i, v in enumerate(np.atleast_1d(ap))}
        for name, fn in [
            ("precision", metrics.precision_score),
            ("recall", metrics.recall_score),
            ("f1", metrics.f1_score),
        ]:
            per_label = fn(truth, pred, average=None, zero_division=0)
            want |= {f"{name}/{i}": v for i, v in enumerate(per_label)}
    return want


def assert_equal_to(got: dict, want: dict) -> None:
    for name, value in want.items():
        assert abs(got[name] - value) <= 1e-9, (name, got[name], value)


def test_metrics_match_sklearn_from_sums_over_uneven_parts():
    logits, y = tagged()
    got = flatten(in_parts(task("multilabel", num_labels=4), logits, y, cuts=(7, 250)))
    assert got["count"] == 600
    assert got["loss"] == pytest.approx(F.binary_cross_entropy_with_logits(logits, y).item())
    p, truth = logits.sigmoid().numpy(), y.numpy().astype(int)
    assert_equal_to(got, sklearn_multilabel(truth, p, [0.5] * 4))


def test_a_label_without_positives_counts_in_the_macro_averages_as_sklearn_counts_it():
    """Rare labels are often absent from a split: macro-F1 and mAP averaged only the labels
    present (0.75 and 0.9167 here), where sklearn counts every label (0.5 and 0.6111)."""
    truth = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    p = np.float32([[0.9, 0.2, 0.1], [0.3, 0.8, 0.4], [0.4, 0.7, 0.2], [0.6, 0.1, 0.3]])
    logits = torch.logit(torch.from_numpy(p).double()).float()
    got = flatten(in_parts(task("multilabel", num_labels=3), logits, torch.tensor(truth).float()))
    assert_equal_to(got, sklearn_multilabel(truth, logits.sigmoid().numpy(), [0.5] * 3))
    # By hand: F1 0.5, 1, 0 (no positives, none predicted); AP 5/6, 1, 0.
    assert got["macro_f1"] == pytest.approx(0.5) and got["map"] == pytest.approx(11 / 18)


@st.composite
def multilabel_cases(draw):
    # From 2: sklearn reads a one-column indicator matrix as binary targets, not labels.
    labels, n = draw(st.integers(2, 8)), draw(st.integers(1, 60))
    rates = draw(
        st.lists(st.sampled_from([0.0, 0.05, 0.5, 1.0]), min_size=labels, max_size=labels)
    )
    truth = [[int(draw(st.floats(0, 1)) < r) for r in rates] for _ in range(n)]
    values = st.sampled_from([-3.0, -0.5, 0.0, 0.5, 1.0, 4.0])  # ties across samples
    logits = draw(st.lists(values, min_size=n * labels, max_size=n * labels))
    parts = tuple(sorted(draw(st.lists(st.integers(0, n), max_size=3))))
    auto = draw(st.booleans())
    return torch.tensor(logits).view(n, labels), np.array(truth), parts, auto


@settings(max_examples=60, deadline=None, derandomize=True)
@given(multilabel_cases())
def test_every_multilabel_metric_equals_sklearn_with_absent_labels_and_ties(case):
    logits, truth, parts, auto = case
    meta, labels = {}, truth.shape[1]
    option = "task.threshold=auto" if auto else "task.threshold=0.5"
    t = task("multilabel", option, meta=meta, num_labels=labels)
    got = flatten(in_parts(t, logits, torch.from_numpy(truth).float(), parts))
    thresholds = [got[f"threshold/{i}"] for i in range(labels)]
    assert_equal_to(got, sklearn_multilabel(truth, logits.sigmoid().numpy(), thresholds))
    if auto:  # each label's threshold gives its best F1 on the split (sklearn's curve)
        metrics = pytest.importorskip("sklearn.metrics")
        assert meta["tuned"]["positives"] == truth.sum(0).tolist()
        for i in range(labels):
            if truth[:, i].any():
                p = logits[:, i].sigmoid().numpy()
                precision, recall, _ = metrics.precision_recall_curve(truth[:, i], p)
                with np.errstate(invalid="ignore", divide="ignore"):
                    f1 = np.nan_to_num(2 * precision * recall / (precision + recall))
                assert abs(got[f"f1/{i}"] - f1.max()) <= 1e-9


def test_auto_thresholds_are_recorded_in_the_data_meta_and_decide_afterwards():
    logits, y = tagged(seed=1)
    meta = {}
    t = task("multilabel", "task.threshold=auto", meta=meta, num_labels=4)
    got = flatten(in_parts(t, logits, y))
    thresholds = meta["tuned"]["thresholds"]
    assert thresholds == [got[f"threshold/{i}"] for i in range(4)] == t.thresholds
    assert thresholds != [0.5] * 4
    # A task built from that meta (evaluate, predict, a resume) decides with them.
    again = task("multilabel", "task.threshold=auto", meta=meta, num_labels=4)
    assert again.thresholds == thresholds


def test_pos_weight_reaches_the_loss_and_the_reported_loss_stays_plain():
    logits, y = tagged(n=64)
    plain = task("multilabel", num_labels=4, label_names=LABELS)
    meta = {"label_counts": [40, 16, 8, 4], "label_rows": 80}
    for option, weights in [
        ("task.pos_weight=[1,1,2,2]", [1.0, 1.0, 2.0, 2.0]),
        ("task.pos_weight={sunset: 4, beach: 1, dog: 2, people: 3}", [1.0, 2.0, 3.0, 4.0]),
        ("task.pos_weight=auto", [40 / 40, 64 / 16, 72 / 8, 76 / 4]),
    ]:
        weighted = task("multilabel", option, meta=meta, num_labels=4, label_names=LABELS)
        want = F.binary_cross_entropy_with_logits(logits, y, pos_weight=torch.tensor(weights))
        assert weighted.loss(logits, y).item() == pytest.approx(want.item(), rel=1e-6), option
        assert in_parts(weighted, logits, y)["loss"] == in_parts(plain, logits, y)["loss"]


@pytest.mark.parametrize(
    "option, message",
    [
        ("task.pos_weight=[1,2]", r"has 2 weights for the 4 labels"),
        ("task.pos_weight={beach: 1, cat: 2}", r"\['cat'\] are not labels"),
        ("task.pos_weight={beach: 1}", r"have no weight"),
    ],
)
def test_pos_weights_that_do_not_fit_the_labels_are_one_line(option, message):
    with pytest.raises(ConfigError, match=message):
        task("multilabel", option, num_labels=4, label_names=LABELS)


@pytest.mark.parametrize(
    "option", ["task.pos_weight=[1,-1]", "task.pos_weight=some", "task.threshold=1.5"]
)
def test_bad_pos_weight_or_threshold_values_are_refused_by_the_config(option):
    with pytest.raises(ConfigError, match=option.split("=")[0].removeprefix("task.")):
        load_config(None, ["task.name=multilabel", option])


def tags_table(path, n: int = 400, columns: bool = False, seed: int = 2) -> None:
    """A table of 6 features and 3 tags each present where its feature is high: one column
    "tags" of joined names, or (columns) one 0/1 column per tag."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    on = (x[:, :3] + 0.3 * torch.randn(n, 3, generator=g)) > 0.3
    names = ["red", "green", "blue"]
    head = ["a", "b", "c", "d", "e", "f", *(names if columns else ["tags"])]
    lines = [",".join(head)]
    for row, tags in zip(x.tolist(), on.tolist(), strict=True):
        labels = [str(int(t)) for t in tags] if columns else ["|".join(
            n for n, t in zip(names, tags, strict=True) if t)]  # fmt: skip
        lines.append(",".join([*(f"{v:.4f}" for v in row), *labels]))
    path.write_text("\n".join(lines) + "\n")


def csv_args(tiny, table, *extra):
    return tiny_with(
        tiny, "data.name=csv", f"data.path={table}", "model.name=mlp", "model.width=16",
        "task.name=multilabel", *extra,
    )  # fmt: skip


def test_the_test_row_is_what_evaluate_split_test_says_at_best_pts_thresholds(tmp_path, capsys):
    """The end-of-run test score used to retune every label's threshold on the test split
    (micro-F1 0.956 in the summary, 0.840 from evaluate.py on the same checkpoint)."""
    from test_test_split import assert_test_row_is_evaluate_split_test, table_run

    train, test = tmp_path / "tags.csv", tmp_path / "test.csv"
    tags_table(train, n=300)
    tags_table(test, n=200, seed=5)
    run = table_run(tmp_path, f"data.path={train}", f"data.test_path={test}", "data.label=tags")
    args = [*run, "task.name=multilabel", "task.threshold=auto", "train.epochs=3"]
    scored, out = assert_test_row_is_evaluate_split_test(tmp_path, capsys, args)
    assert "threshold tuned on the validation split's positives: " in out
    assert 0 < scored["micro_f1"] < 1 and {"map", "exact_match", "f1/red"} <= set(scored)


def test_a_joined_column_and_0_1_columns_read_as_the_same_targets(tmp_path, tiny):
    from {{ cookiecutter.package_name }}.trainer import build_data

    joined, columns = tmp_path / "joined.csv", tmp_path / "columns.csv"
    tags_table(joined)
    tags_table(columns, columns=True)
    one = build_data(load_config(None, csv_args(tiny, joined, "data.label=tags")))
    many = build_data(load_config(None, csv_args(tiny, columns, "data.label=[red,green,blue]")))
    assert one[2]["labels"] == ["blue", "green", "red"]  # sorted names of the one column
    assert many[2]["labels"] == ["red", "green", "blue"]  # the columns' order
    y_one = torch.stack([one[0][i][1] for i in range(len(one[0]))])
    y_many = torch.stack([many[0][i][1] for i in range(len(many[0]))])
    assert torch.equal(y_one, y_many[:, [2, 1, 0]])
    assert one[2]["label_counts"] == y_one.sum(0).tolist() and one[2]["label_rows"] == 360
    assert one[3].num_outputs == 3 and one[3].label_names == ["blue", "green", "red"]


@pytest.mark.parametrize(
    "edit, label, message",
    [
        (lambda t: t.replace(",1\n", ",maybe\n", 1), "[red,green,blue]", "holds 'maybe'"),
        (lambda t: t, "[red,green,nope]", "has no column 'nope'"),
        # A blank 0/1 cell was read as 0, while 'maybe' was refused.
        (lambda t: t.replace(",1\n", ",\n", 1), "[red,green,blue]", "holds an empty cell"),
        # Columns named with the separator: the prediction column could not be read back.
        (lambda t: t.replace("red,", "red|ish,", 1), "[red|ish,green,blue]", "'red|ish' holds"),
        # One joined column whose names hold predict.py's "|" under another separator.
        (lambda t: t, "tags", "' holds '|', which joins labels"),
    ],
)
def test_bad_label_columns_are_one_line(tmp_path, tiny, edit, label, message):
    table = tmp_path / "t.csv"
    tags_table(table, columns=label != "tags")
    table.write_text(edit(table.read_text()))
    sep = ["data.label_sep=;"] if label == "tags" else []
    with pytest.raises(ConfigError, match=re.escape(message)):
        fit(load_config(None, csv_args(tiny, table, f"data.label={label}", *sep)))
    assert not (tmp_path / "runs").exists()


def test_a_blank_label_separator_is_refused_by_the_config():
    for blank in ("' '", "|"):  # a bare | is YAML's block marker: the empty string
        with pytest.raises(ConfigError, match="data.label_sep must be one or more characters"):
            load_config(None, ["data.name=csv", f"data.label_sep={blank}"])


def test_a_label_the_training_table_lacks_and_a_list_for_one_class_are_refused(tmp_path, tiny):
    train, val = tmp_path / "train.csv", tmp_path / "val.csv"
    tags_table(train)
    tags_table(val, n=40, seed=5)
    val.write_text(val.read_text().replace("red", "purple", 1))
    with pytest.raises(ConfigError, match="label 'purple', which the training table"):
        fit(load_config(None, csv_args(tiny, train, "data.label=tags", f"data.val_path={val}")))
    args = tiny_with(tiny, "data.name=csv", f"data.path={train}", "model.name=mlp",
                     "data.label=[a,b]")  # fmt: skip
    with pytest.raises(ConfigError, match="only multi-label targets read"):
        fit(load_config(None, args))
    assert not (tmp_path / "runs").exists()


def test_tensor_files_with_0_1_float_targets_train_and_other_values_are_refused(tmp_path, tiny):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    y = (x[:, :3] > 0).float()
    for name, rows in (("train.pt", slice(0, 160)), ("val.pt", slice(160, 200))):
        torch.save({"x": x[rows], "y": y[rows]}, tmp_path / name)
    args = tiny_with(tiny, "data.name=tensors", f"data.root={tmp_path}", "model.name=mlp",
                     "task.name=multilabel", "task.pos_weight=auto")  # fmt: skip
    result = fit(load_config(None, args))
    assert {"map", "micro_f1", "ap/2", "f1/0"} <= set(result["metrics"])
    torch.save({"x": x[:160], "y": y[:160] * 2}, tmp_path / "train.pt")
    with pytest.raises(ConfigError, match="multi-label targets must be 0 or 1"):
        fit(load_config(None, [*args, "run.name=other"]))


@pytest.mark.slow  # trains, evaluates, predicts, exports  # feature: export
@pytest.mark.slow  # trains, evaluates, predicts  # feature: !export
def test_a_multilabel_table_trains_and_every_tool_uses_its_thresholds(tmp_path, tiny, capsys):
    table = tmp_path / "tags.csv"
    tags_table(table, n=600)
    args = csv_args(tiny, table, "data.label=tags", "task.pos_weight=auto",
                    "task.threshold=auto", "train.epochs=4")  # fmt: skip
    result = fit(load_config(None, args))
    run = tmp_path / "runs" / "default"
    best = checkpoint.load(run / "best.pt")
    thresholds = best["data"]["tuned"]["thresholds"]
    assert len(thresholds) == 3 and best["data"]["labels"] == ["blue", "green", "red"]
    with (run / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert {"val/map", "val/micro_f1", "val/exact_match", "val/ap/red", "val/f1/blue"} <= set(
        header
    )
    evaluated = evaluate_checkpoint(str(run / "best.pt"), report_dir=str(tmp_path / "report"))
    assert evaluated["map"] == result["best"]
    assert [evaluated[f"threshold/{n}"] for n in ("blue", "green", "red")] == thresholds
    with (tmp_path / "report" / "per_class.csv").open() as f:
        per_label = list(csv.DictReader(f))
    assert [r["label"] for r in per_label] == ["blue", "green", "red"]
    for r in per_label:
        assert float(r["f1"]) == pytest.approx(evaluated[f"f1/{r['label']}"])
    out = tmp_path / "predictions.csv"
    done = predict(str(run / "best.pt"), [], split="val", out=str(out))
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["input", "prediction", "prob_blue", "prob_green", "prob_red"]
    for row in rows:
        labels = zip(("blue", "green", "red"), thresholds, strict=True)
        decided = [float(row[f"prob_{n}"]) >= t for n, t in labels]
        assert [int(row[f"pred_{n}"]) for n in ("blue", "green", "red")] == decided
        assert row["prediction"] == "|".join(
            n for n, d in zip(("blue", "green", "red"), decided, strict=True) if d
        )
    assert done["accuracy"] == pytest.approx(evaluated["exact_match"])  # the same decisions
    # >>> export
    assert export_main(["--checkpoint", str(run / "best.pt"), "--format", "export"]) == 0
    exported = json.loads((run / "best.pt2.json").read_text())
    assert exported["output"]["labels"] == ["blue", "green", "red"]
    assert exported["output"]["thresholds"] == thresholds
    assert "probability per label" in exported["output"]["units"]
    program = torch.export.load(str(run / "best.pt2")).module()
    raw = torch.tensor([[float(v) for v in line.split(",")[:6]]
                        for line in table.read_text().splitlines()[1:9]])  # fmt: skip
    probabilities = program(raw)
    assert ((probabilities >= 0) & (probabilities <= 1)).all()  # the sigmoid is inside
    predict(str(run / "best.pt"), [str(table)], out=str(tmp_path / "raw.csv"))
    with (tmp_path / "raw.csv").open() as f:
        first = list(csv.DictReader(f))[:8]
    want = [float(r[f"prob_{n}"]) for r in first for n in ("blue", "green", "red")]
    assert probabilities.flatten().tolist() == pytest.approx(want, abs=1e-5)
    # <<< export
    capsys.readouterr()
    with pytest.raises(ConfigError, match="task.pos_weight=none differs"):
        fit(load_config(None, [*args, "train.epochs=5", "train.resume=auto",
                               "task.pos_weight=none"]))  # fmt: skip


# >>> images
def test_an_image_folder_with_a_labels_file_trains_multilabel_and_predicts(tmp_path, tiny):
    from test_image_folder import write_images

    write_images(tmp_path / "photos" / "a", 30)
    write_images(tmp_path / "photos" / "b", 30, seed=1)
    lines = ["file,labels"] + [
        f"{part}/{i:03d}.png,{'|'.join(['cat'] * (i % 2) + ['dog'] * (part == 'b'))}"
        for part in ("a", "b") for i in range(30)
    ]  # fmt: skip
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    args = tiny_with(tiny, "data.name=image_folder", f"data.root={tmp_path / 'photos'}",
                     f"data.labels={tmp_path / 'labels.csv'}", "data.image_size=8",
                     "task.name=multilabel", "train.batch_size=8")  # fmt: skip
    result = fit(load_config(None, args))
    assert {"map", "f1/cat", "ap/dog"} <= set(result["metrics"])
    best = checkpoint.load(tmp_path / "runs" / "default" / "best.pt")
    assert best["data"]["labels"] == ["cat", "dog"] and best["data"]["label_rows"] == 54
    out = tmp_path / "p.csv"
    predict(str(tmp_path / "runs" / "default" / "best.pt"), [str(tmp_path / "photos" / "b")],
            out=str(out))  # fmt: skip
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30 and {"prob_cat", "pred_dog"} <= set(rows[0])
    assert all(row["label"] == "" for row in rows)  # a folder name says nothing of labels
    (tmp_path / "labels.csv").write_text("file,labels\na/000.png,cat\na/999.png,dog\n")
    with pytest.raises(ConfigError, match="names '.*999.png', which does not exist"):
        fit(load_config(None, [*args, "run.name=other"]))
    # An image listed twice, even with other labels, was read as two samples.
    (tmp_path / "labels.csv").write_text("file,labels\na/000.png,cat\na/001.png,\na/000.png,dog\n")
    with pytest.raises(ConfigError, match=r"lists '.*000.png' twice \(lines 2 and 4\)"):
        fit(load_config(None, [*args, "run.name=other"]))
# <<< images
