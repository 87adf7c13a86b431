"""CSV tables: classification or regression from a config alone, statistics from the training
rows only and kept in the checkpoint, and one clear line for each kind of bad table."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_with

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_datasets
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint, evaluate_main
from {{ cookiecutter.package_name }}.tools.predict import predict_main, read_csv
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.trainer import fit

FAST = ["run.device=cpu", "run.log_every=1000", "run.loggers=csv", "train.warmup_steps=5"]


def table(path, header: str, rows: list[str]) -> str:
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def run_train(argv: list[str], capsys) -> tuple[int, str]:
    """scripts/train.py's train_main in-process: (exit code, stderr). A subprocess costs ~3 s
    of imports; test_train.py and test_bad_input.py run the real scripts."""
    capsys.readouterr()
    code = train_main(argv)
    return code, capsys.readouterr().err


def evaluated(best: Path, capsys) -> dict:
    """The JSON line of `scripts/evaluate.py --checkpoint best --json`, in-process."""
    capsys.readouterr()
    assert evaluate_main(["--checkpoint", str(best), "--json"]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


@pytest.mark.slow
def test_a_csv_classification_runs_from_the_command_line_alone(demo_data, tmp_path, capsys):
    args = [
        "data.name=csv",
        "data.path=data/demo/classes.csv",
        "data.label=species",
        "model.name=mlp",
        "train.epochs=2",
        f"run.output_dir={tmp_path}",
        *FAST,
    ]
    code, stderr = run_train(args, capsys)
    assert code == 0, stderr
    state = checkpoint.load(tmp_path / "default" / "best.pt")
    meta = state["data"]
    assert meta["classes"] == ["setosa", "versicolor", "virginica"]
    assert meta["features"] == [f"f{i}" for i in range(20)] and meta["label"] == "species"
    assert meta["split"]["val"] == 200 and meta["split"]["train"] == 1800  # val_fraction 0.1
    # The statistics are the training rows' only, not the whole table's.
    cfg = load_config(None, args)
    train, _, _ = build_datasets(cfg.data, "class")
    raw = torch.tensor(
        [
            [float(v) for v in line.split(",")[:20]]
            for line in (demo_data / "data/demo/classes.csv").read_text().splitlines()[1:]
        ]
    )
    assert torch.allclose(torch.tensor(meta["mean"]), raw[train.indices].mean(0), atol=1e-5)
    assert not torch.allclose(torch.tensor(meta["mean"]), raw.mean(0), atol=1e-7)
    metrics = evaluated(tmp_path / "default/best.pt", capsys)
    assert metrics["count"] == 200 and metrics["acc"] > 0.8


def test_a_separate_validation_table_and_classes_by_name(tmp_path, tiny):
    train = table(
        tmp_path / "t.csv", "a,b,kind", [f"{i},{i % 3},{'xy'[i % 2]}" for i in range(40)]
    )
    val = table(tmp_path / "v.csv", "a,b,kind", [f"{i},{i % 3},{'yx'[i % 2]}" for i in range(10)])
    cfg = load_config(
        None,
        [
            "data.name=csv",
            f"data.path={train}",
            f"data.val_path={val}",
            "data.label=kind",
            "model.name=mlp",
        ],
    )
    train_set, val_set, meta = build_datasets(cfg.data, "class")
    assert len(train_set) == 40 and len(val_set) == 10 and meta["classes"] == ["x", "y"]
    assert val_set.y.tolist() == [1, 0] * 5  # ids follow the training table's names
    # Validation features are standardised with the training table's statistics.
    assert torch.allclose(
        val_set.x[:, 0], (torch.arange(10.0) - 19.5) / torch.arange(40.0).std(correction=0)
    )


@pytest.mark.slow
def test_a_regression_target_trains_and_evaluates_with_the_same_numbers(demo_data, tiny):
    cfg = load_config(
        ROOT / "configs/experiments/csv_regression.yaml",
        tiny_with(tiny, "data.name=csv", "model.name=mlp", "train.epochs=3", "run.name=reg"),
    )
    result = fit(cfg)
    assert set(result["metrics"]) == {"loss", "rmse", "mae", "r2", "count"}
    again = evaluate_checkpoint(f"{cfg.run.output_dir}/reg/best.pt")
    assert again["rmse"] == pytest.approx(result["best"], rel=1e-5)


@pytest.mark.parametrize(
    ("header", "rows", "extra", "message"),
    [
        ("a,b,label", ["1,2,x", "3,oops,y"], [], "line 3: column 'b' holds 'oops', not a number"),
        ("a,b,label", ["1,2,x", "3,4"], [], "line 3 has 2 fields, the header 3"),
        ("a,b,target", ["1,2,x", "3,4,y"], [], "has no column 'label' (columns: a, b, target)"),
        ("a,b,label", ["1,2,x", "3,4,x"], [], "holds one class only"),
        ("a,b,label", ["1,2,x", "3,4,y"], ["task.name=regression"], "holds 'x', not a number"),
        ("a,b,label", ["1,2,x", "3,nan,y"], [], "line 3 holds inf or nan"),
        ("a,b,label", ["1,2,x", "3,4,y"], ["data.features=a,c"], "has no column 'c'"),
    ],
)
def test_bad_tables_get_one_line_naming_the_row_or_column(
    tmp_path, tiny, header, rows, extra, message, capsys
):
    path = table(tmp_path / "bad.csv", header, rows * 10)
    args = tiny_with(tiny, "data.name=csv", f"data.path={path}", "model.name=mlp", *extra)
    code, stderr = run_train(args, capsys)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert message in lines[0] and str(path) in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_missing_table_names_the_key(tmp_path, tiny, capsys):
    args = tiny_with(tiny, "data.name=csv", f"data.path={tmp_path}/no.csv")
    code, stderr = run_train(args, capsys)
    assert code == 2
    assert "no.csv' not found; set data.path to your table" in stderr


@pytest.mark.slow
def test_the_csv_regression_example_reaches_its_bar_and_evaluates_the_same(
    demo_data, tmp_path, capsys
):
    """The example as shipped: R^2 above 0.95 on held-out rows in seconds."""
    args = [
        "--config",
        str(ROOT / "configs/experiments/csv_regression.yaml"),
        f"run.output_dir={tmp_path}",
        "run.device=cpu",
        "run.log_every=1000",
    ]
    code, stderr = run_train(args, capsys)
    assert code == 0, stderr
    best = tmp_path / "csv_regression" / "best.pt"
    metrics = evaluated(best, capsys)
    assert metrics["r2"] > 0.95, metrics
    assert metrics["rmse"] == pytest.approx(checkpoint.load(best)["progress"]["best"], rel=1e-5)


def test_a_validation_table_with_other_columns_is_named_in_the_error(tmp_path):
    train = table(
        tmp_path / "t.csv", "a,b,kind", [f"{i},{i % 3},{'xy'[i % 2]}" for i in range(20)]
    )
    val = table(tmp_path / "v.csv", "a,b,c,kind", [f"{i},1,2,{'xy'[i % 2]}" for i in range(6)])
    cfg = load_config(None, ["data.name=csv", f"data.path={train}", f"data.val_path={val}",
                             "data.label=kind", "model.name=mlp"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"v.csv' \(data.val_path\) has the feature column 'c'"):
        build_datasets(cfg.data, "class")


# A table whose label depends on f0 and f2, as written, with its columns reversed, and with
# f2 renamed: the same rows each time.
COLUMNS = {"original": [0, 1, 2, 3], "reordered": [3, 2, 1, 0], "renamed": [0, 1, 2, 3]}
NAMES = ["f0", "f1", "f2", "f3"]


def feature_table(path, how: str, rows: int = 96) -> str:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 4)) * [1, 5, 2, 0.5] + [0, 10, -3, 1]
    kind = np.where(2 * x[:, 0] - (x[:, 2] + 3) > 0, "a", "b")
    names = [n.replace("f2", "g2") if how == "renamed" else n for n in NAMES]
    order = COLUMNS[how]
    lines = [",".join([*(f"{r[i]:.5f}" for i in order), k]) for r, k in zip(x, kind, strict=True)]
    return table(path, ",".join([*(names[i] for i in order), "kind"]), lines)


def csv_run(tmp_path, how: str, *extra: str) -> list[str]:
    path = feature_table(tmp_path / f"{how}.csv", how)
    return [*FAST, "data.name=csv", f"data.path={path}", "data.label=kind", "model.name=mlp",
            "model.width=8", "train.batch_size=16", "run.name=r", *extra]  # fmt: skip


def last_weights(folder: Path) -> dict:
    return checkpoint.load(folder / "r" / "last.pt")["model"]


def test_a_resumed_run_reads_a_reordered_table_by_column_name(tmp_path):
    """The table's columns in another order: the run continues exactly as on the original
    (they were taken by position: accuracy fell from 0.85 to 0.545 without a word)."""
    first = [f"run.output_dir={tmp_path / 'a'}", "train.epochs=2", "train.max_steps=4"]
    fit(load_config(None, csv_run(tmp_path, "original", *first)))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for how, out in (("original", "a"), ("reordered", "b")):
        more = [f"run.output_dir={tmp_path / out}", "train.epochs=2", "train.resume=auto"]
        fit(load_config(None, csv_run(tmp_path, how, *more)))
    a, b = last_weights(tmp_path / "a"), last_weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert checkpoint.load(tmp_path / "b/r/last.pt")["data"]["features"] == NAMES


def test_a_renamed_column_is_refused_on_resume_and_fine_tuning(tmp_path, capsys):
    out = f"run.output_dir={tmp_path / 'runs'}"
    fit(load_config(None, csv_run(tmp_path, "original", out, "train.epochs=1")))
    run = tmp_path / "runs" / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    line = "has no column 'f2', a feature of the checkpoint (it has 'g2' instead)"
    resume = csv_run(tmp_path, "renamed", out, "train.epochs=2", "train.resume=auto")
    code, stderr = run_train(resume, capsys)
    assert code == 2 and stderr.count("\n") == 1 and line in stderr, stderr
    assert {p: (run / p).read_bytes() for p in before} == before
    tuned = csv_run(tmp_path, "renamed", out, "run.name=ft", f"train.init_from={run / 'best.pt'}")
    code, stderr = run_train(tuned, capsys)
    assert code == 2 and line in stderr, stderr
    assert not (tmp_path / "runs" / "ft").exists()


@pytest.mark.slow
def test_fine_tuning_and_evaluation_read_a_reordered_table_by_column_name(tmp_path):
    fit(load_config(None, csv_run(tmp_path, "original", f"run.output_dir={tmp_path / 'runs'}")))
    best = tmp_path / "runs" / "r" / "best.pt"
    tuned = {}
    for how in ("original", "reordered"):
        out = f"run.output_dir={tmp_path / how}"
        fit(load_config(None, csv_run(tmp_path, how, out, f"train.init_from={best}")))
        tuned[how] = last_weights(tmp_path / how)
    assert all(torch.equal(tuned["original"][k], tuned["reordered"][k]) for k in tuned["original"])
    metrics = {
        how: evaluate_checkpoint(str(best), [f"data.path={tmp_path / how}.csv"])
        for how in ("original", "reordered")
    }
    assert metrics["original"] == metrics["reordered"] and metrics["original"]["acc"] > 0.6


def test_a_validation_table_in_another_column_order_reads_by_name(tmp_path):
    train = feature_table(tmp_path / "t.csv", "original")
    sets = {}
    for how in ("original", "reordered"):
        val = feature_table(tmp_path / f"v-{how}.csv", how, rows=24)
        cfg = load_config(None, ["data.name=csv", f"data.path={train}", f"data.val_path={val}",
                                 "data.label=kind", "model.name=mlp"])  # fmt: skip
        sets[how] = build_datasets(cfg.data, "class")[1]
    assert torch.equal(sets["original"].x, sets["reordered"].x)


def diabetes_like(path, rows: int = 442) -> tuple[np.ndarray, np.ndarray]:
    """A table like sklearn's diabetes: 10 features in their own units, a target of mean ~152
    and std ~77 that a linear fit explains about half of."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 10)) * rng.uniform(0.5, 20, 10) + rng.uniform(-50, 50, 10)
    signal = ((x - x.mean(0)) / x.std(0)) @ rng.standard_normal(10)
    y = 152 + 77 * 0.7 * (signal / signal.std() + rng.standard_normal(rows))
    lines = [",".join(f"{v:.6g}" for v in (*row, t)) for row, t in zip(x, y, strict=True)]
    table(path, ",".join([*(f"x{i}" for i in range(10)), "y"]), lines)
    return x, y


def least_squares_r2(x, y, train, val) -> float:
    """R² on the rows `val` of a linear fit (with intercept) to the rows `train`."""
    design = np.hstack([x, np.ones((len(x), 1))])
    w = np.linalg.lstsq(design[train], y[train], rcond=None)[0]
    err = design[val] @ w - y[val]
    return 1 - (err**2).sum() / ((y[val] - y[val].mean()) ** 2).sum()


@pytest.mark.slow
def test_targets_far_from_zero_learn_at_the_example_settings(tmp_path):
    """Regression targets are standardised with the training rows' statistics: with the CSV
    example's settings (lr 3e-3, 30 epochs) a target of mean 152 gets as far as a linear
    fit. Unstandardised, the network spent its steps walking its output up to 152."""
    x, y = diabetes_like(tmp_path / "d.csv")
    cfg = load_config(
        ROOT / "configs/experiments/csv_regression.yaml",
        [f"data.path={tmp_path / 'd.csv'}", f"run.output_dir={tmp_path}", *FAST[:3]],
    )
    fit(cfg)
    best = tmp_path / "csv_regression" / "best.pt"
    meta = checkpoint.load(best)["data"]
    train, val, _ = build_datasets(cfg.data, "value")
    assert meta["target_mean"] == pytest.approx([y[train.indices].mean()], rel=1e-6)
    assert meta["target_std"] == pytest.approx([y[train.indices].std()], rel=1e-6)
    metrics = evaluate_checkpoint(str(best))
    linear = least_squares_r2(x, y, train.indices, val.indices)
    assert linear > 0.3 and metrics["r2"] > linear - 0.05, (metrics, linear)
    # rmse is in the target's own units, and so are predictions: those of the validation
    # rows give evaluate's rmse.
    assert 0.5 * 77 < metrics["rmse"] < 77
    out = tmp_path / "p.csv"
    assert predict_main(["--checkpoint", str(best), f"{tmp_path}/d.csv", f"--out={out}"]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    err = np.array([float(rows[i]["prediction"]) for i in val.indices]) - y[val.indices]
    assert np.sqrt((err**2).mean()) == pytest.approx(metrics["rmse"], rel=1e-4)


def test_a_constant_column_is_not_blown_up_at_prediction(tmp_path):
    """A column constant over the training rows has std 0: it is divided by 1, not 1e-8, so
    a new value in it stays a moderate number."""
    path = table(tmp_path / "c.csv", "a,c,y", [f"{i},5,{i % 2}" for i in range(20)])
    cfg = load_config(None, ["data.name=csv", f"data.path={path}", "data.label=y"])
    _, _, meta = build_datasets(cfg.data, "class")
    assert meta["std"][1] == 1.0 and meta["mean"][1] == 5.0
    new = table(tmp_path / "new.csv", "a,c", ["3,6"])
    _, x, _ = read_csv(Path(new), SimpleNamespace(meta=meta, path="best.pt"))
    assert x[0, 1].item() == pytest.approx(1.0)


def test_a_constant_target_is_not_blown_up(tmp_path):
    path = table(tmp_path / "c.csv", "a,y", [f"{i},7" for i in range(20)])
    cfg = load_config(None, ["data.name=csv", f"data.path={path}", "data.label=y"])
    assert build_datasets(cfg.data, "value")[2]["target_std"] == [1.0]
