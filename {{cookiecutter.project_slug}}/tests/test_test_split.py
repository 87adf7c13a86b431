"""The held-out test split (data.test_path, an image folder's test/), evaluate.py --split test # feature: images
"""The held-out test split (data.test_path), evaluate.py --split test # feature: !images
and --data FILE, and the documentation's rule on validation splits other than the checkpoint's."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import documentation
from PIL import Image  # feature: images

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError  # feature: text
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.trainer import fit

README = documentation()  # README.md and docs/, words, not line breaks


def write_table(path: Path, rows: int, seed: int, columns=("a", "b", "c")) -> str:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, len(columns), generator=g)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*columns, "y"])
        for row in x.tolist():
            writer.writerow([f"{v:.4f}" for v in row] + ["yes" if row[0] + row[1] > 0 else "no"])
    return str(path)


def table_run(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "data.name=csv",
        f"data.path={write_table(tmp_path / 'train.csv', 200, 0)}",
        "data.label=y",
        "model.name=mlp",
        "model.width=16",
        "train.epochs=2",
        "train.batch_size=16",
        "train.warmup_steps=2",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path / 'runs'}",
        *extra,
    ]


def evaluated(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert evaluate_main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def refused(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert evaluate_main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_the_test_table_is_scored_once_at_the_end_with_best_pt_and_recorded(tmp_path, capsys):
    test = write_table(tmp_path / "test.csv", 120, 1)
    capsys.readouterr()
    fit(load_config(None, table_run(tmp_path, f"data.test_path={test}")))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.lstrip().startswith("test (")]
    assert len(lines) == 1 and lines[0].lstrip().startswith("test (best.pt"), out
    best = tmp_path / "runs" / "default" / "best.pt"
    state = checkpoint.load(best)
    # Never trained on: the training table alone was split into train and val.
    assert state["data"]["split"]["train"] + state["data"]["split"]["val"] == 200
    assert state["data"]["test"] == {"path": test, "samples": 120}
    with (tmp_path / "runs" / "runs.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["test_model"] == "best.pt" and int(row["test_count"]) == 120
    scored = evaluated(capsys, "--checkpoint", str(best), "--split", "test")
    assert scored["split"] == "test" and scored["count"] == 120
    assert scored["acc"] == pytest.approx(float(row["test_acc"]), abs=1e-6)
    assert re.search(rf"acc {scored['acc']:.4f}", lines[0])
    assert f"--checkpoint {best} --split test" in out  # the next commands name it
    assert f"scripts/predict.py --checkpoint {best} {test} --out" in out  # not the training one
    # The test table changed since: refused, pointing at --data.
    write_table(tmp_path / "test.csv", 100, 1)
    assert "evaluate.py --data FILE" in refused(
        capsys, "--checkpoint", str(best), "--split", "test"
    )


def write_rare(path: Path, rows: int, seed: int) -> str:
    """A table whose positive class is rare (about 12 %) and only partly predictable."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, generator=g)
    rare = x[:, 0] + 0.8 * torch.randn(rows, generator=g) > 1.2
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "y"])
        for row, r in zip(x.tolist(), rare.tolist(), strict=True):
            writer.writerow([f"{v:.4f}" for v in row] + ["yes" if r else "no"])
    return str(path)


def assert_test_row_is_evaluate_split_test(tmp_path: Path, capsys, overrides: list[str]):
    """Train with a test split, then: the summary's test line, runs.csv's test_* columns and
    `evaluate.py --split test` on best.pt agree on every metric, at best.pt's own tuned
    threshold(s), never tuned on the test split. Returns evaluate's metrics and the output."""
    capsys.readouterr()
    fit(load_config(None, overrides))
    out = capsys.readouterr().out
    best = tmp_path / "runs" / "default" / "best.pt"
    with (tmp_path / "runs" / "runs.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["test_model"] == "best.pt"
    scored = evaluated(capsys, "--checkpoint", str(best), "--split", "test")
    tested = {k.removeprefix("test_"): v for k, v in row.items() if k.startswith("test_")}
    del tested["model"]
    assert tested.keys() == scored.keys() - {"checkpoint", "step", "split"}
    for key, value in tested.items():
        assert float(value) == pytest.approx(scored[key], rel=1e-5, abs=1e-6), key  # 6 digits
    (line,) = [x for x in out.splitlines() if x.lstrip().startswith("test (best.pt")]
    assert f"macro_f1 {scored['macro_f1']:.4f}" in line
    tuned = checkpoint.load(best)["data"]["tuned"]
    thresholds = tuned.get("thresholds") or [tuned["threshold"]]
    scored_at = [v for k, v in scored.items() if k == "threshold" or k.startswith("threshold/")]
    assert scored_at == thresholds  # best.pt's, not retuned on the test split
    return scored, out


def test_the_test_row_is_what_evaluate_split_test_says_with_a_tuned_threshold(tmp_path, capsys):
    """The end-of-run test score used to retune task.threshold=auto on the test split."""
    test = write_rare(tmp_path / "test.csv", 300, 1)
    table = write_rare(tmp_path / "train.csv", 400, 0)
    run = table_run(tmp_path, f"data.path={table}", f"data.test_path={test}")
    scored, out = assert_test_row_is_evaluate_split_test(
        tmp_path, capsys, [*run, "task.threshold=auto", "train.epochs=3"]
    )
    assert 0 < scored["recall/yes"] < 1 and "auroc" in scored
    positives = checkpoint.load(tmp_path / "runs/default/best.pt")["data"]["tuned"]["positives"]
    assert f"threshold tuned on the validation split's positives: {positives}\n" in out


def test_evaluate_data_scores_any_labelled_table_with_the_checkpoints_columns(tmp_path, capsys):
    fit(load_config(None, table_run(tmp_path)))
    best = str(tmp_path / "runs" / "default" / "best.pt")
    other = write_table(tmp_path / "other.csv", 50, 2, columns=("c", "a", "b"))  # by name
    scored = evaluated(capsys, "--checkpoint", best, "--data", other)
    assert scored["data"] == other and scored["count"] == 50
    missing = write_table(tmp_path / "missing.csv", 50, 2, columns=("a", "b", "d"))
    err = refused(capsys, "--checkpoint", best, "--data", missing)
    assert "no column 'c'" in err and "(--data)" in err
    # No test split recorded, none configured: one line saying how to give one.
    assert "data.test_path=FILE" in refused(capsys, "--checkpoint", best, "--split", "test")


def test_other_validation_rows_are_refused_as_the_readme_says(tmp_path, capsys):
    """The README: evaluate refuses a split of other rows and names --data / --split test. A
    data.val_path table of 1,000 rows was scored against a checkpoint that held out 40."""
    assert "more or fewer samples" in README and "evaluate.py --data" in README
    fit(load_config(None, table_run(tmp_path)))
    best = str(tmp_path / "runs" / "default" / "best.pt")
    other = write_table(tmp_path / "other.csv", 1000, 3)
    for override in (f"data.val_path={other}", "data.val_fraction=0.2"):
        err = refused(capsys, "--checkpoint", best, override)
        assert "--data FILE" in err and "--split test" in err, err
    # A run that validates on a table of its own: another table in its place is refused too.
    val = write_table(tmp_path / "val.csv", 60, 4)
    fit(load_config(None, table_run(tmp_path, f"data.val_path={val}", "run.name=own")))
    own = str(tmp_path / "runs" / "own" / "best.pt")
    assert evaluated(capsys, "--checkpoint", own)["count"] == 60
    assert "60 then" in refused(capsys, "--checkpoint", own, f"data.val_path={other}")


def test_a_val_fraction_of_0_2_trains_and_evaluates(tmp_path, capsys):
    fit(load_config(None, table_run(tmp_path, "data.val_fraction=0.2")))
    best = str(tmp_path / "runs" / "default" / "best.pt")
    assert evaluated(capsys, "--checkpoint", best)["count"] == 40
    assert evaluated(capsys, "--checkpoint", best, "data.val_fraction=0.2")["count"] == 40


def test_checkpoints_from_before_the_test_split_still_evaluate(tmp_path, capsys):
    fit(
        load_config(
            None, table_run(tmp_path, "data.val_path=" + write_table(tmp_path / "val.csv", 60, 4))
        )
    )
    best = tmp_path / "runs" / "default" / "best.pt"
    state = checkpoint.load(best)
    state["data"].pop("val_samples")  # as saved before this key existed
    torch.save(state, best)
    assert evaluated(capsys, "--checkpoint", str(best))["count"] == 60
    test = write_table(tmp_path / "test.csv", 30, 5)
    scored = evaluated(
        capsys, "--checkpoint", str(best), "--split", "test", f"data.test_path={test}"
    )
    assert scored["count"] == 30


# >>> images
def write_images(folder: Path, count: int, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        pixels = torch.randint(256, (8, 8, 3), generator=g, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"{i:03d}.png")
# <<< images


# >>> images
def test_an_image_folders_test_subfolder_is_held_out_and_not_a_class(tmp_path, capsys):
    root = tmp_path / "images"
    for k, name in enumerate(("cat", "dog")):
        write_images(root / name, 12, k)
        write_images(root / "test" / name, 3, 10 + k)
    args = [
        "data.name=image_folder",
        f"data.root={root}",
        "data.image_size=8",
        "model.width=8",
        "train.epochs=1",
        "train.batch_size=4",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path / 'runs'}",
    ]
    fit(load_config(None, args))
    state = checkpoint.load(tmp_path / "runs" / "default" / "best.pt")
    assert state["data"]["classes"] == ["cat", "dog"] and state["data"]["test"]["samples"] == 6
    scored = evaluated(
        capsys, "--checkpoint", str(tmp_path / "runs/default/best.pt"), "--split", "test"
    )
    assert scored["count"] == 6
# <<< images


# >>> text
def test_a_test_text_is_read_with_the_training_vocabulary(tmp_path, capsys):
    text = "the cat sat on the mat. " * 40
    (tmp_path / "train.txt").write_text(text)
    (tmp_path / "test.txt").write_text("a cat on a mat. " * 10)
    args = [
        "data.name=text",
        f"data.path={tmp_path / 'train.txt'}",
        f"data.test_path={tmp_path / 'test.txt'}",
        "data.seq_len=8",
        "model.name=transformer",
        "model.width=16",
        "model.depth=1",
        "model.heads=2",
        "model.max_len=8",
        "task.name=language_model",
        "train.epochs=1",
        "train.batch_size=8",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path / 'runs'}",
    ]
    fit(load_config(None, args))
    best = str(tmp_path / "runs" / "default" / "best.pt")
    assert evaluated(capsys, "--checkpoint", best, "--split", "test")["count"] > 0
    (tmp_path / "new.txt").write_text("a dog on a log. " * 10)  # d, g: not in training
    with pytest.raises(ConfigError, match="the character 'd', which the training text"):
        fit(load_config(None, [*args, f"data.test_path={tmp_path / 'new.txt'}", "run.name=x"]))
# <<< text
