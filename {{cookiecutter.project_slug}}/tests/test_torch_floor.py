"""The oldest torch the project supports (pyproject's floor, 2.6): every file that names it
says the same, and what needs a newer torch is refused below its version with one line and
nothing written. CI's floor job runs the fast tests on the floor itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, documentation

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError  # feature: fsdp
from {{ cookiecutter.package_name }}.tools.export import export_main
from {{ cookiecutter.package_name }}.trainer import fit


def floor() -> str:
    # A regex, not tomllib: it reads only the one line it needs.
    text = (ROOT / "pyproject.toml").read_text()
    (found,) = re.findall(r'^dependencies = \["torch>=(\d+\.\d+)"', text, re.M)
    return found


def test_every_file_that_names_the_floor_says_the_same():
    assert floor() == "2.6"
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    assert [line for line in requirements if line.startswith("torch")] == [f"torch>={floor()}"]
    named = re.findall(r"torch>=([\d.]+)", documentation())
    assert named and set(named) == {floor()}


@pytest.fixture
def torch_2_6(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")


# >>> fsdp
def test_fsdp_on_the_cpu_below_torch_2_7_is_refused_before_anything_is_written(tiny, torch_2_6):
    message = r"train.strategy=fsdp on the CPU needs torch >= 2.7 \(this is 2.6.0\+cu124\)"
    with pytest.raises(ConfigError, match=message):
        fit(load_config(None, [*tiny, "train.strategy=fsdp"]))
    assert not Path(load_config(None, tiny).run.output_dir).exists()
# <<< fsdp


def test_onnx_export_below_torch_2_7_is_refused_with_one_line(tmp_path, tiny, torch_2_6, capsys):
    out = Path(load_config(None, tiny).run.output_dir)
    fit(load_config(None, [*tiny, "model.name=mlp", "train.max_steps=1"]))
    capsys.readouterr()
    before = sorted(tmp_path.rglob("*"))
    args = ["--checkpoint", str(out / "default/last.pt"), "--format", "onnx"]
    assert export_main([*args, "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --format onnx needs torch >= 2.7" in err[0], err
    assert sorted(tmp_path.rglob("*")) == before
