"""One tiny run per task family, in-process, in the fast layer (`make test`): train a few
steps, stop as SIGTERM does, resume to the end, evaluate the checkpoint. It catches a broken
dataset, model, task, training step, checkpoint or evaluation in seconds; the slow layer
(`make test-all`) holds the bitwise-resume, signal, fault and multi-process tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import lm_overrides, stop_after, tiny_with  # feature: text
from conftest import stop_after, tiny_with  # feature: !text

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint
from {{ cookiecutter.package_name }}.trainer import fit

STOP = 3  # the optimizer step the stop arrives after, mid first epoch in each family


def classification(tmp_path: Path, tiny: list[str]) -> list[str]:
    """The default synthetic images and CNN, 4 steps an epoch."""
    return [*tiny, "data.train_size=64", "data.val_size=32"]


def regression(tmp_path: Path, tiny: list[str]) -> list[str]:
    """An MLP on a CSV table of 72 rows (64 train, 4 steps an epoch)."""
    rows = [f"{i % 7},{i % 5},{(i % 7) - 0.5 * (i % 5)}" for i in range(72)]
    (tmp_path / "table.csv").write_text("\n".join(["a,b,y", *rows]) + "\n")
    data = ["data.name=csv", f"data.path={tmp_path / 'table.csv'}", "data.label=y"]
    choice = ["data.val_fraction=0.125", "model.name=mlp", "task.name=regression"]
    return tiny_with(tiny, *data, *choice)


# >>> text
def language_model(tmp_path: Path, tiny: list[str]) -> list[str]:
    """A one-block transformer on 600 characters of text."""
    path = tmp_path / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 14, encoding="utf-8")
    return [*lm_overrides(tmp_path, path), "train.batch_size=16"]
# <<< text


@pytest.mark.parametrize("family", [classification, regression, language_model])  # feature: text
@pytest.mark.parametrize("family", [classification, regression])  # feature: !text
def test_train_stop_resume_and_evaluate(family, tmp_path, tiny, monkeypatch):
    args = [*family(tmp_path, tiny), "train.epochs=2", "run.name=e2e"]
    first = fit(load_config(None, [*args, *stop_after(monkeypatch, STOP)]))
    assert first["step"] == STOP and first["stopped"] == "SIGTERM"
    resumed = fit(load_config(None, [*args, "train.resume=auto"]))
    assert resumed["epoch"] == 2 and resumed["step"] > STOP and not resumed["stopped"]
    run = Path(load_config(None, args).run.output_dir) / "e2e"
    evaluated = evaluate_checkpoint(str(run / "last.pt"))
    assert evaluated["step"] == resumed["step"]
    for name, value in resumed["metrics"].items():
        assert evaluated[name] == pytest.approx(value, rel=1e-5), name
