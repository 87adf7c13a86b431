"""scripts/export.py: each format loads back and matches the eager model; a broken artifact
or a model the format cannot follow fails with a non-zero exit and one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY
from torch import nn

from {{ cookiecutter.package_name }} import cli, export
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.inference import load_trained, validation_inputs
from {{ cookiecutter.package_name }}.trainer import fit

# Each test trains, then exports or checks parity: make test-all.
pytestmark = pytest.mark.slow

ONNX = ("onnx", "onnxscript", "onnxruntime")


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> str:
    """A tiny cnn (BatchNorm included) trained for one epoch on synthetic images."""
    out = tmp_path_factory.mktemp("export")
    fit(load_config(None, [*TINY, "train.epochs=1", f"run.output_dir={out}"]))
    return str(out / "default" / "best.pt")


def run_export(best: str, fmt: str, out: Path, *args: str) -> int:
    return cli.export_main(["--checkpoint", best, "--format", fmt, "--out", str(out), *args])


@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_each_format_loads_back_and_matches_the_model(best, fmt, tmp_path):
    if fmt == "onnx" and not all(importlib.util.find_spec(m) for m in ONNX):
        pytest.skip("needs the [export] extra: onnx, onnxscript, onnxruntime")
    out = tmp_path / f"model{export.SUFFIXES[fmt]}"
    assert run_export(best, fmt, out) == 0
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert meta["format"] == fmt and meta["task"] == "classification"
    assert meta["input_shape"] == ["batch", 3, 8, 8] and meta["input_dtype"] == "float32"
    assert meta["classes"] == [f"angle_{c}" for c in range(4)]
    assert meta["preprocessing"]["image_size"] == 8
    parity = meta["parity"]
    assert parity["passed"] and parity["inputs"] == "validation" and parity["samples"] == 64
    # Another batch size than the one exported with: the batch dimension is dynamic.
    trained = load_trained(best)
    x = validation_inputs(trained, 5)
    with torch.no_grad():
        got, expected = export.run_artifact(fmt, out, x), trained.model(x)
    assert got.shape == (5, 4) and torch.allclose(got, expected, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_broken_artifact_fails_the_parity_check(best, tmp_path, monkeypatch, capsys):
    original = export.EXPORTERS["torchscript"]

    def export_then_corrupt(model, example, path):
        original(model, example, path)
        artifact = torch.jit.load(str(path))
        with torch.no_grad():
            next(artifact.parameters()).add_(0.5)  # as if a weight were saved wrong
        torch.jit.save(artifact, str(path))

    monkeypatch.setitem(export.EXPORTERS, "torchscript", export_then_corrupt)
    out = tmp_path / "model.pt"
    assert run_export(best, "torchscript", out) == 1
    err = capsys.readouterr().err
    assert "FAILED parity: max abs difference" in err and len(err.splitlines()) == 1
    assert json.loads(out.with_name("model.pt.json").read_text())["parity"]["passed"] is False
    # A tolerance as loose as the damage lets it pass: the check is against --atol.
    assert run_export(best, "torchscript", out, "--atol", "1e6") == 0


class ValueBranch(nn.Module):
    """A model whose Python control flow depends on tensor values: torch.export cannot follow."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.head(x.flatten(1))
        return -self.head(x.flatten(1))


def test_a_model_the_format_cannot_export_names_the_construct(best, tmp_path, monkeypatch, capsys):
    trained = load_trained(best)
    trained.model = ValueBranch().eval()
    monkeypatch.setattr(export, "load_trained", lambda path: trained)
    assert run_export(best, "export", tmp_path / "m.pt2") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "test_export.py" in err and "in forward" in err
    assert "depends on tensor values" in err and "try --format torchscript" in err


def test_without_the_data_parity_runs_on_random_inputs(best, tmp_path, monkeypatch):
    def no_data(trained, n):
        raise ConfigError("data file not found")

    monkeypatch.setattr(export, "validation_inputs", no_data)
    assert run_export(best, "torchscript", tmp_path / "m.pt") == 0
    parity = json.loads((tmp_path / "m.pt.json").read_text())["parity"]
    assert parity["inputs"] == "random" and parity["passed"]


def hide_module(monkeypatch, hidden: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name)
    )


def test_onnx_without_its_packages_is_one_line(best, tmp_path, monkeypatch, capsys):
    hide_module(monkeypatch, "onnxscript")
    assert run_export(best, "onnx", tmp_path / "m.onnx") == 2
    assert "pip install -e '.[export]'" in capsys.readouterr().err


def test_onnx_without_onnxruntime_exports_with_a_note(best, tmp_path, monkeypatch, capsys):
    if not all(importlib.util.find_spec(m) for m in ONNX[:2]):
        pytest.skip("needs onnx and onnxscript")
    hide_module(monkeypatch, "onnxruntime")
    assert run_export(best, "onnx", tmp_path / "m.onnx") == 0
    out = capsys.readouterr().out
    assert "parity: onnxruntime is not installed: not checked" in out
    assert len(out.splitlines()) == 1 and (tmp_path / "m.onnx").stat().st_size > 0


def test_a_regression_artifact_answers_in_the_targets_units(tmp_path):
    """The model learns standardised targets; the artifact must map back, as predict.py does,
    so a serving team gets prices, not z-scores."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 3, generator=g)
    y = 1000 + 50 * x[:, 0] - 20 * x[:, 1]
    rows = [
        ",".join(f"{v:.4f}" for v in [*a, b]) for a, b in zip(x.tolist(), y.tolist(), strict=True)
    ]
    (tmp_path / "t.csv").write_text("a,b,c,price\n" + "\n".join(rows) + "\n")
    cfg = [
        "data.name=csv",
        f"data.path={tmp_path / 't.csv'}",
        "data.label=price",
        "model.name=mlp",
        "model.width=8",
        "task.name=regression",
        "train.epochs=1",
        "train.batch_size=16",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path}",
    ]
    fit(load_config(None, cfg))
    best, out = str(tmp_path / "default" / "best.pt"), tmp_path / "m.torchscript.pt"
    assert run_export(best, "torchscript", out) == 0
    trained = load_trained(best)
    inputs = validation_inputs(trained, 8)
    with torch.no_grad():
        got = export.run_artifact("torchscript", out, inputs)
        expected = trained.task.decode(trained.model(inputs)).float()
    assert torch.allclose(got, expected, atol=1e-3)
    assert got.mean() > 500  # in the targets' units (around 1000), not standardised (around 0)
