"""CSV tables: classification or regression from a config alone, statistics from the training
rows only and kept in the checkpoint, and one clear line for each kind of bad table."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT, run_script, tiny_with

from {{ cookiecutter.package_name }} import checkpoint, cli
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_datasets
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit

FAST = ["run.device=cpu", "run.log_every=1000", "run.loggers=csv", "train.warmup_steps=5"]


def table(path, header: str, rows: list[str]) -> str:
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def test_a_csv_classification_runs_from_the_command_line_alone(demo_data, tmp_path):
    args = [
        "data.name=csv",
        "data.path=data/demo/classes.csv",
        "data.label=species",
        "model.name=mlp",
        "train.epochs=2",
        f"run.output_dir={tmp_path}",
        *FAST,
    ]
    done = run_script(str(ROOT / "scripts" / "train.py"), *args, cwd=demo_data)
    assert done.returncode == 0, done.stderr
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
    metrics = json.loads(
        run_script(
            str(ROOT / "scripts/evaluate.py"),
            "--checkpoint",
            str(tmp_path / "default/best.pt"),
            cwd=demo_data,
        ).stdout.splitlines()[-1]
    )
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


def test_a_regression_target_trains_and_evaluates_with_the_same_numbers(demo_data, tiny):
    cfg = load_config(
        ROOT / "configs/experiments/csv_regression.yaml",
        tiny_with(tiny, "data.name=csv", "model.name=mlp", "train.epochs=3", "run.name=reg"),
    )
    result = fit(cfg)
    assert set(result["metrics"]) == {"loss", "rmse", "mae", "r2", "count"}
    again = cli.evaluate_checkpoint(f"{cfg.run.output_dir}/reg/best.pt")
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
    tmp_path, tiny, header, rows, extra, message
):
    path = table(tmp_path / "bad.csv", header, rows * 10)
    args = tiny_with(tiny, "data.name=csv", f"data.path={path}", "model.name=mlp", *extra)
    done = run_script("scripts/train.py", *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert message in lines[0] and str(path) in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_missing_table_names_the_key(tmp_path, tiny):
    done = run_script(
        "scripts/train.py", *tiny_with(tiny, "data.name=csv", f"data.path={tmp_path}/no.csv")
    )
    assert done.returncode == 2
    assert "no.csv' not found; set data.path to your table" in done.stderr


@pytest.mark.slow
def test_the_csv_regression_example_reaches_its_bar_and_evaluates_the_same(demo_data, tmp_path):
    """The example as shipped: R^2 above 0.95 on held-out rows in seconds."""
    args = [
        "--config",
        str(ROOT / "configs/experiments/csv_regression.yaml"),
        f"run.output_dir={tmp_path}",
        "run.device=cpu",
        "run.log_every=1000",
    ]
    done = run_script(str(ROOT / "scripts/train.py"), *args, cwd=demo_data, timeout=600)
    assert done.returncode == 0, done.stderr
    best = tmp_path / "csv_regression" / "best.pt"
    out = run_script(str(ROOT / "scripts/evaluate.py"), "--checkpoint", str(best), cwd=demo_data)
    metrics = json.loads(out.stdout.splitlines()[-1])
    assert metrics["r2"] > 0.95, metrics
    assert metrics["rmse"] == pytest.approx(checkpoint.load(best)["progress"]["best"], rel=1e-5)


def test_a_validation_table_with_other_columns_is_named_in_the_error(tmp_path):
    train = table(
        tmp_path / "t.csv", "a,b,kind", [f"{i},{i % 3},{'xy'[i % 2]}" for i in range(20)]
    )
    val = table(tmp_path / "v.csv", "a,b,c,kind", [f"{i},1,2,{'xy'[i % 2]}" for i in range(6)])
    cfg = load_config(None, ["data.name=csv", f"data.path={train}", f"data.val_path={val}",
                             "data.label=kind", "model.name=mlp"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"v.csv' \(data.val_path\) has other feature columns"):
        build_datasets(cfg.data, "class")
