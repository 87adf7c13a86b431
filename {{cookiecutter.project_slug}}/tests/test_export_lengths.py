"""A language model's artifact takes prompts of any length up to model.max_len, as its JSON
says, in every format: trained on windows of 16 tokens with room for 32, it answers a 5-token
and a 32-token prompt as the eager model does, and export's own parity check ran all three."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import NEEDS_TORCH_2_7, lm_overrides

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools import formats
from {{ cookiecutter.package_name }}.tools.export import export_main
from {{ cookiecutter.package_name }}.tools.inference import load_trained
from {{ cookiecutter.package_name }}.trainer import fit

pytestmark = pytest.mark.slow  # trains, then exports

SUFFIXES = {"torchscript": ".torchscript.pt", "export": ".pt2", "onnx": ".onnx"}


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("lm")
    text = tmp / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20, encoding="utf-8")
    args = [a for a in lm_overrides(tmp, text) if not a.startswith("model.max_len=")]
    fit(load_config(None, [*args, "model.max_len=32"]))  # data.seq_len=16
    return str(tmp / "runs/default/best.pt")


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # TorchScript's trace: known
@pytest.mark.parametrize(
    "fmt", ["torchscript", "export", pytest.param("onnx", marks=NEEDS_TORCH_2_7)]
)
def test_a_language_model_artifact_takes_every_length_up_to_max_len(best, fmt, tmp_path):
    if fmt == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("needs onnxruntime: pip install -e '.[export]'")
    out = tmp_path / f"lm{SUFFIXES[fmt]}"
    assert export_main(["--checkpoint", best, "--format", fmt, "--out", str(out)]) == 0
    meta = json.loads(Path(f"{out}.json").read_text())
    assert meta["input"]["shape"] == meta["input_shape"] == ["batch", "positions"]
    assert meta["input"]["positions"] == {"min": 1, "max": 32}
    assert meta["parity"]["lengths"] == [16, 5, 32] and meta["parity"]["passed"]
    model = load_trained(best).model
    for length in (5, 32, 1):
        tokens = torch.randint(0, meta["num_outputs"], (3, length))
        with torch.no_grad():
            got, expected = formats.run_artifact(fmt, out, tokens), model(tokens)
        assert got.shape == (3, length, meta["num_outputs"])
        assert (got - expected).abs().max().item() < 1e-4
