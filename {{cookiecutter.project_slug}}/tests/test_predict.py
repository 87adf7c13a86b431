"""scripts/predict.py: each input kind read with the checkpoint's preprocessing gives the
predictions that evaluate.py scores."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, lm_overrides, tiny_with

from {{ cookiecutter.package_name }} import cli
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.inference import load_trained, validation_set
from {{ cookiecutter.package_name }}.trainer import fit

# Each test trains a run to predict with: make test-all.
pytestmark = pytest.mark.slow


def best_of(overrides: list[str], config=None) -> str:
    cfg = load_config(config, overrides)
    fit(cfg)
    return str(Path(cfg.run.output_dir) / cfg.run.name / "best.pt")


def predict(checkpoint: str, *args: str, out: Path) -> list[dict]:
    assert cli.predict_main(["--checkpoint", checkpoint, *args, "--out", str(out)]) == 0
    with out.open(newline="") as f:
        return list(csv.DictReader(f))


def accuracy(rows: list[dict]) -> float:
    return sum(r["prediction"] == r["label"] for r in rows) / len(rows)


def test_synthetic_val_split_and_tensor_file_match_evaluate(tiny, tmp_path):
    best = best_of(tiny)
    acc = cli.evaluate_checkpoint(best)["acc"]
    rows = predict(best, "--split", "val", out=tmp_path / "split.csv")
    assert len(rows) == 96 and accuracy(rows) == pytest.approx(acc)
    assert all(0 < float(r["probability"]) <= 1 for r in rows)
    # The same samples as a tensor file: {"x": ..., "y": ...}, read without the dataset.
    val = validation_set(load_trained(best))
    torch.save({"x": val.x, "y": val.y}, tmp_path / "val.pt")
    rows = predict(best, str(tmp_path / "val.pt"), out=tmp_path / "file.csv")
    assert accuracy(rows) == pytest.approx(acc)
    assert rows[0]["input"] == f"{tmp_path / 'val.pt'}:0"


def csv_run(demo_data, tiny, kind: str) -> str:
    config = CONFIGS / "experiments" / "csv_regression.yaml"
    output_dir = load_config(None, tiny).run.output_dir  # tiny's other keys are synthetic's
    common = ["train.epochs=2", "run.loggers=csv", "run.device=cpu"]
    common += [f"run.output_dir={output_dir}", f"run.name=csv_{kind}"]
    if kind == "classes":
        common += ["data.path=data/demo/classes.csv", "data.label=species"]
        common += ["task.name=classification"]
    return best_of(common, config)


def val_rows(best: str, rows: list[dict], table: str) -> list[dict]:
    """The rows of the run's validation split, found by their line in the table."""
    lines = {f"{table}:{i + 2}" for i in validation_set(load_trained(best)).indices}
    return [r for r in rows if r["input"] in lines]


def test_csv_classes_match_evaluate_on_the_validation_rows(demo_data, tiny, tmp_path):
    best = csv_run(demo_data, tiny, "classes")
    acc = cli.evaluate_checkpoint(best)["acc"]
    table = "data/demo/classes.csv"
    rows = predict(best, table, out=tmp_path / "p.csv")
    assert len(rows) == 2000 and {r["prediction"] for r in rows} <= {
        "setosa",
        "versicolor",
        "virginica",
    }
    assert accuracy(val_rows(best, rows, table)) == pytest.approx(acc)


def test_csv_regression_values_match_evaluate_rmse(demo_data, tiny, tmp_path):
    best = csv_run(demo_data, tiny, "regression")
    rmse = cli.evaluate_checkpoint(best)["rmse"]
    table = "data/demo/regression.csv"
    rows = val_rows(best, predict(best, table, out=tmp_path / "p.csv"), table)
    err = [float(r["prediction"]) - float(r["label"]) for r in rows]
    assert math.sqrt(sum(e * e for e in err) / len(err)) == pytest.approx(rmse, rel=1e-3)


def test_tensor_file_targets_far_from_zero_are_predicted_in_their_units(tiny, tmp_path):
    """Float targets of train.pt: their mean and std (of train.pt alone, not val.pt) travel
    in the checkpoint, which evaluate and predict read back; predictions are in y's units."""
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 64), ("val", 24)):
        x = torch.randn(n, 3, generator=g)
        y = 1000 + 50 * x @ torch.tensor([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]])  # (n, 2)
        torch.save({"x": x, "y": y + 100 * (split == "val")}, tmp_path / f"{split}.pt")
    data = ["data.name=tensors", f"data.root={tmp_path}", "task.name=regression"]
    best = best_of(tiny_with(tiny, *data, "model.name=mlp", "train.epochs=1"))
    meta = load_trained(best).meta
    train_y = torch.load(tmp_path / "train.pt")["y"].double()
    assert meta["target_mean"] == pytest.approx(train_y.mean(0).tolist(), rel=1e-9)
    assert meta["target_std"] == pytest.approx(train_y.std(0, correction=0).tolist(), rel=1e-9)
    rmse = cli.evaluate_checkpoint(best)["rmse"]
    rows = predict(best, str(tmp_path / "val.pt"), out=tmp_path / "p.csv")
    pred = torch.tensor([[float(r["prediction_0"]), float(r["prediction_1"])] for r in rows])
    err = pred - torch.load(tmp_path / "val.pt")["y"]
    assert 900 < pred.mean() < 1200 and err.square().mean().sqrt() == pytest.approx(rmse, rel=1e-4)


def test_a_table_without_the_trained_columns_is_one_line(demo_data, tiny, tmp_path, capsys):
    best = csv_run(demo_data, tiny, "classes")
    (tmp_path / "short.csv").write_text("f0,f1\n1,2\n")
    code = cli.predict_main(["--checkpoint", best, str(tmp_path / "short.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "lacks the feature column 'f2'" in err and len(err.splitlines()) == 1
    (tmp_path / "notes.txt").write_text("hi")
    assert cli.predict_main(["--checkpoint", best, str(tmp_path / "notes.txt")]) == 2
    assert cli.predict_main(["--checkpoint", best, "--prompt", "hi"]) == 2
    assert "unknown file type" in capsys.readouterr().err


def test_image_files_match_evaluate(tiny, tmp_path):
    from PIL import Image  # in the dev extra

    g = torch.Generator().manual_seed(0)
    colours = {"blue": (0, 0, 200), "red": (200, 0, 0)}
    for split, n in (("train", 24), ("val", 8)):
        for name, colour in colours.items():
            (tmp_path / "img" / split / name).mkdir(parents=True)
            for i in range(n):
                noise = torch.randint(0, 50, (12, 12, 3), generator=g)
                pixels = (torch.tensor(colour) + noise).clamp(0, 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(tmp_path / "img" / split / name / f"{i}.png")
    data = ["data.name=image_folder", f"data.root={tmp_path / 'img'}", "data.image_size=8"]
    best = best_of(
        tiny_with(tiny, *data, "model.name=mlp", "train.batch_size=8", "train.epochs=1")
    )
    acc = cli.evaluate_checkpoint(best)["acc"]
    rows = predict(best, str(tmp_path / "img" / "val"), out=tmp_path / "p.csv")
    assert len(rows) == 16 and accuracy(rows) == pytest.approx(acc)


def test_a_prompt_is_continued_with_the_checkpoint_vocabulary(tiny, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("abcab" * 400)
    best = best_of(tiny_with(tiny, *lm_overrides(tmp_path, tmp_path / "t.txt")))
    capsys.readouterr()
    code = cli.predict_main(["--checkpoint", best, "--prompt", "ab", "--tokens", "5"])
    text = capsys.readouterr().out.strip()
    assert code == 0 and text.startswith("ab") and len(text) == 7 and set(text) <= set("abc")
    assert cli.predict_main(["--checkpoint", best, "--prompt", "xyz"]) == 2
