"""scripts/predict.py: each input kind read with the checkpoint's preprocessing gives the
predictions that evaluate.py scores."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, TINY, lm_overrides, tiny_with  # feature: text
from conftest import CONFIGS, TINY, tiny_with  # feature: !text

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint, evaluate_main
from {{ cookiecutter.package_name }}.tools.inference import load_trained, validation_set
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import fit

# Each test trains a run to predict with: make test-all.
pytestmark = pytest.mark.slow


def best_of(overrides: list[str], config=None) -> str:
    cfg = load_config(config, overrides)
    fit(cfg)
    return str(Path(cfg.run.output_dir) / cfg.run.name / "best.pt")


def predict(checkpoint: str, *args: str, out: Path) -> list[dict]:
    assert predict_main(["--checkpoint", checkpoint, *args, "--out", str(out)]) == 0
    with out.open(newline="") as f:
        return list(csv.DictReader(f))


def accuracy(rows: list[dict]) -> float:
    return sum(r["prediction"] == r["label"] for r in rows) / len(rows)


def test_predictions_run_under_the_checkpoint_amp_as_evaluate_does(tiny, tmp_path):
    """A bf16 run's validation (and so best.pt) was measured under bf16 autocast: predict.py
    computes the same probabilities and accuracy as evaluate.py; --amp off gives fp32."""
    best = best_of([*tiny, "train.amp=bf16", "train.epochs=1"])
    trained = load_trained(best)
    x = torch.stack([xy[0] for xy in validation_set(trained)])
    with torch.no_grad():
        fp32 = trained.model(x).softmax(-1).max(-1).values
        with torch.autocast("cpu", torch.bfloat16):
            bf16 = trained.model(x).float().softmax(-1).max(-1).values
    rows = predict(best, "--split", "val", out=tmp_path / "amp.csv")
    got = torch.tensor([float(r["probability"]) for r in rows])
    assert torch.allclose(got, bf16, atol=1e-6) and not torch.allclose(got, fp32, atol=1e-4)
    assert accuracy(rows) == pytest.approx(evaluate_checkpoint(best)["acc"])
    rows = predict(best, "--split", "val", "--amp", "off", out=tmp_path / "amp.csv")
    assert torch.allclose(torch.tensor([float(r["probability"]) for r in rows]), fp32, atol=1e-6)


def test_synthetic_val_split_and_tensor_file_match_evaluate(tiny, tmp_path):
    best = best_of(tiny)
    acc = evaluate_checkpoint(best)["acc"]
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
    acc = evaluate_checkpoint(best)["acc"]
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
    rmse = evaluate_checkpoint(best)["rmse"]
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
    rmse = evaluate_checkpoint(best)["rmse"]
    rows = predict(best, str(tmp_path / "val.pt"), out=tmp_path / "p.csv")
    pred = torch.tensor([[float(r["prediction_0"]), float(r["prediction_1"])] for r in rows])
    err = pred - torch.load(tmp_path / "val.pt")["y"]
    assert 900 < pred.mean() < 1200 and err.square().mean().sqrt() == pytest.approx(rmse, rel=1e-4)


def test_a_table_without_the_trained_columns_is_one_line(demo_data, tiny, tmp_path, capsys):
    best = csv_run(demo_data, tiny, "classes")
    (tmp_path / "short.csv").write_text("f0,f1\n1,2\n")
    code = predict_main(["--checkpoint", best, str(tmp_path / "short.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "lacks the feature column 'f2'" in err and len(err.splitlines()) == 1
    (tmp_path / "notes.txt").write_text("hi")
    assert predict_main(["--checkpoint", best, str(tmp_path / "notes.txt")]) == 2
    assert predict_main(["--checkpoint", best, "--prompt", "hi"]) == 2  # feature: text
    assert "unknown file type" in capsys.readouterr().err


# >>> images
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
    acc = evaluate_checkpoint(best)["acc"]
    rows = predict(best, str(tmp_path / "img" / "val"), out=tmp_path / "p.csv")
    assert len(rows) == 16 and accuracy(rows) == pytest.approx(acc)
# <<< images


# >>> text
def test_a_prompt_is_continued_with_the_checkpoint_vocabulary(tiny, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("abcab" * 400)
    best = best_of(tiny_with(tiny, *lm_overrides(tmp_path, tmp_path / "t.txt")))
    capsys.readouterr()
    code = predict_main(["--checkpoint", best, "--prompt", "ab", "--tokens", "5"])
    text = capsys.readouterr().out.strip()
    assert code == 0 and text.startswith("ab") and len(text) == 7 and set(text) <= set("abc")
    assert predict_main(["--checkpoint", best, "--prompt", "xyz"]) == 2
# <<< text


# Bad inputs: each is refused before the model runs, on one line naming the input and the fix;
# an --out file that existed is left as it was.


class NotATensor:  # pickled by torch.save, refused by torch.load(weights_only=True)
    pass


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Two small checkpoints: a CSV classifier (columns a, b, c; classes x, y, z) and a
    classifier of (3, 8, 8) tensors with classes 0..3."""
    root = tmp_path_factory.mktemp("models")
    rows = [f"{i % 7},{i % 5},{(i * 3) % 11},{'xyz'[i % 3]}" for i in range(60)]
    (root / "t.csv").write_text("\n".join(["a,b,c,kind", *rows]) + "\n")
    common = [*TINY, f"run.output_dir={root}", "model.name=mlp", "train.epochs=1"]
    table = ["data.name=csv", f"data.path={root / 't.csv'}", "data.label=kind"]
    return {
        "csv": best_of(tiny_with(common, *table, "run.name=csv")),
        "tensor": best_of(tiny_with(common, "run.name=tensor")),
    }


def tensors(n: int = 2, **blob) -> dict:
    return {"x": torch.randn(n, 3, 8, 8), **blob}


def with_nan() -> dict:
    blob = tensors(3)
    blob["x"][1, 2, 4, 4] = float("nan")
    return blob


BAD_FILES = [
    ("csv", "dup.csv", "a,b,a,c\n1,2,3,4\n", "has the column 'a' twice"),
    ("csv", "short.csv", "a,b,c\n1,2,3\n1,2\n", "line 3 has 2 fields, the header 3"),
    ("csv", "long.csv", "a,b,c\n1,2,3,4\n", "line 2 has 4 fields, the header 3"),
    ("csv", "word.csv", "a,b,c\n1,oops,3\n", "line 2: column 'b' holds 'oops', not a number"),
    ("csv", "nan.csv", "a,b,c\n1,2,3\n1,nan,3\n", "line 3: column 'b' holds 'nan'"),
    ("csv", "inf.csv", "a,b,c\n1,2,-inf\n", "line 2: column 'c' holds '-inf'"),
    ("csv", "big.csv", "a,b,c\n1,2,3\n1,2,3e39\n", "big.csv:3 holds nan or inf"),
    ("csv", "latin.csv", "a,b,c\n1,2,3 # café\n".encode("latin-1"), "is not UTF-8 text"),
    ("csv", "quote.csv", 'a,b,c\n1,2,"3' + "4" * 70000 + "\n", "field over 65536 characters"),
    ("csv", "zebra.csv", "a,b,c,kind\n1,2,3,x\n1,2,3,zebra\n", "line 3: column 'kind' holds "),
    ("csv", "header.csv", "a,b,c\n", "needs a header row and at least one data row"),
    ("csv", "x.pt", tensors(), "was trained on a CSV table"),
    ("tensor", "text.pt", "not a tensor file\n", "is not a file written by torch.save"),
    ("tensor", "object.pt", {"x": NotATensor()}, "holds pickled Python objects"),
    ("tensor", "keys.pt", {"inputs": torch.zeros(2, 3, 8, 8)}, "not a tensor 'x'"),
    ("tensor", "int.pt", {"x": torch.ones(2, 3, 8, 8, dtype=torch.int64)}, "x is int64, the"),
    ("tensor", "shape.pt", {"x": torch.zeros(2, 3, 4, 4)}, "inputs of shape (3, 4, 4), the"),
    ("tensor", "empty.pt", {"x": torch.zeros(0, 3, 8, 8)}, "holds no inputs"),
    ("tensor", "nan.pt", with_nan(), "nan.pt:1 holds nan or inf"),
    ("tensor", "y4.pt", tensors(y=torch.tensor([0, 4])), "y holds class 4, but the model has"),
    ("tensor", "yneg.pt", tensors(y=torch.tensor([-1, 0])), "y holds class -1, but the model"),
    ("tensor", "yfloat.pt", tensors(y=torch.tensor([0.0, 1.0])), "the model is a classifier"),
    ("tensor", "ylen.pt", tensors(y=torch.tensor([0, 1, 2])), "y is 3 labels for 2 inputs"),
]


def refused(capsys, tmp_path, argv: list[str]) -> str:
    """The one error line of predict_main(argv), checked: exit 2, nothing written."""
    out = tmp_path / "preds.csv"
    out.write_text("kept\n")
    before = set(tmp_path.iterdir())
    capsys.readouterr()
    code = predict_main([*argv, "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert out.read_text() == "kept\n" and set(tmp_path.iterdir()) == before
    return lines[0]


@pytest.mark.parametrize(("model", "name", "content", "fragment"), BAD_FILES)
def test_a_bad_input_file_is_refused_on_one_line(
    models, tmp_path, capsys, model, name, content, fragment
):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        torch.save(content, path)
    line = refused(capsys, tmp_path, ["--checkpoint", models[model], str(path)])
    assert fragment in line and name in line and len(line) < 400


BAD_OPTIONS = [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--batch-size", "-3"], "--batch-size must be >= 1, got -3"),
    (["--device", "gpu"], "--device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
    (["--device", "cuda:x"], "--device must be auto, cpu, cuda, cuda:N or mps"),
    (["--split", "val", "good.csv"], "--split val reads the run's own split: leave out"),
    # >>> text
    (["--prompt", "ab", "--temperature", "nan"], "--temperature must be >= 0"),
    (["--prompt", "ab", "--temperature", "-1"], "--temperature must be >= 0"),
    (["good.csv", "--temperature", "nan"], "--temperature must be >= 0"),  # checked, if unused
    (["--prompt", "ab", "--top-k", "-2"], "--top-k must be >= 0"),
    (["--prompt", "ab", "--tokens", "-1"], "--tokens must be >= 0"),
    (["--prompt", "ab", "good.csv"], "--prompt continues text: leave out"),
    (["--prompt", "ab", "--split", "val"], "--prompt continues text: leave out --split val"),
    # <<< text
    (["--split", "val", "--amp", "fp16"], "--amp=fp16 needs a GPU; use --amp=bf16 on CPU"),
]


@pytest.mark.parametrize(("args", "fragment"), BAD_OPTIONS)
def test_a_bad_option_is_refused_on_one_line(models, tmp_path, capsys, args, fragment):
    (tmp_path / "good.csv").write_text("a,b,c\n1,2,3\n")
    args = [str(tmp_path / a) if a == "good.csv" else a for a in args]
    assert fragment in refused(capsys, tmp_path, ["--checkpoint", models["csv"], *args])


def test_an_fp16_checkpoint_on_the_cpu_is_refused_as_training_refuses_it(models, tmp_path, capsys):
    """fp16 autocast needs a GPU (training refuses train.amp=fp16 on the CPU): a checkpoint of
    a GPU run under fp16, predicted or evaluated on the CPU, is one line with the way out; the
    two tools choose by one rule (inference_amp)."""
    state = checkpoint.load(models["tensor"])
    state["config"]["train"]["amp"] = "fp16"  # as a GPU run saves it
    fp16 = tmp_path / "fp16.pt"
    torch.save(state, fp16)
    line = refused(capsys, tmp_path, ["--checkpoint", str(fp16), "--split", "val"])
    assert "runs under its train.amp=fp16 unless --amp says otherwise" in line, line
    assert "--amp=bf16 on CPU" in line, line
    assert len(predict(str(fp16), "--split", "val", "--amp", "off", out=tmp_path / "p.csv")) == 96
    capsys.readouterr()
    assert evaluate_main(["--checkpoint", str(fp16)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unless train.amp says otherwise" in line and "train.amp=bf16 on CPU" in line, line
    assert not (tmp_path / "fp16_report").exists()
    assert evaluate_main(["--checkpoint", str(fp16), "train.amp=off", "--json"]) == 0


def test_good_inputs_still_predict_and_csv_columns_are_found_by_name(models, tmp_path):
    """The same checks pass good inputs: columns in another order, padded names, an extra
    column and a label column with known classes; y of class ids; --split val alone."""
    table = tmp_path / "new.csv"
    table.write_text("id, c ,kind,a,b\n7,3,x,1,2\n8,3,,1,2\n")
    rows = predict(models["csv"], str(table), out=tmp_path / "p.csv")
    assert [r["label"] for r in rows] == ["x", ""] and rows[0]["prediction"] in "xyz"
    torch.save(tensors(y=torch.tensor([0, 3])), tmp_path / "y.pt")
    rows = predict(models["tensor"], str(tmp_path / "y.pt"), out=tmp_path / "q.csv")
    assert [r["label"] for r in rows] == ["angle_0", "angle_3"]
    assert len(predict(models["tensor"], "--split", "val", out=tmp_path / "v.csv")) == 96


def test_duplicate_columns_are_refused_in_training(tmp_path):
    """Today the second column named 'a' would be read as a copy of the first."""
    from {{ cookiecutter.package_name }}.data import build_datasets
    from {{ cookiecutter.package_name }}.errors import ConfigError

    path = tmp_path / "t.csv"
    path.write_text(
        "a,b,a,kind\n" + "".join(f"{i},{i % 3},{-i},{'xy'[i % 2]}\n" for i in range(20))
    )
    cfg = load_config(None, ["data.name=csv", f"data.path={path}", "data.label=kind"])
    with pytest.raises(ConfigError, match=r"t.csv' has the column 'a' twice; rename or drop one"):
        build_datasets(cfg.data, "class")
