"""docs/extending.md's "Adding a dataset" and "Adding a model" examples, as written there:
each is one file plus one registry line, and together they train and evaluate with no other
change."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from conftest import ROOT, tiny_with

from {{ cookiecutter.package_name }} import data, models
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint
from {{ cookiecutter.package_name }}.trainer import fit

pytestmark = pytest.mark.slow  # trains and evaluates: make test-all


def readme_file(name: str, monkeypatch) -> types.ModuleType:
    """docs/extending.md's code block that starts with `# <package>/<name>`, imported as a
    module."""
    text = (ROOT / "docs" / "extending.md").read_text()
    block = next(
        b
        for b in re.findall(r"```python\n(.*?)```", text, re.S)
        if b.split("\n")[0].endswith(name)
    )
    module = types.ModuleType("readme_" + name.replace("/", "_").removesuffix(".py"))
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses look it up
    exec(compile(block, name, "exec"), module.__dict__)
    return module


def test_the_readme_s_new_dataset_and_model_train_and_evaluate(tmp_path, tiny, monkeypatch):
    my_data = readme_file("data/my_data.py", monkeypatch)
    my_net = readme_file("models/my_net.py", monkeypatch)
    monkeypatch.setitem(data.DATASETS, "my_data", my_data.MyData)  # the registry lines
    monkeypatch.setitem(models.MODELS, "my_net", my_net.MyNet)
    rng = np.random.default_rng(0)
    root = tmp_path / "samples"
    root.mkdir()
    for i in range(120):  # "3_0001.npy": class 3; the class sets the mean, so it is learnable
        label = i % 3
        np.save(root / f"{label}_{i:04d}.npy", rng.normal(label, 0.5, (2, 4, 4)).astype("float32"))
    args = tiny_with(
        tiny,
        "data.name=my_data",
        f"data.root={root}",
        "model.name=my_net",
        "model.hidden=16",
        "train.epochs=10",
        "train.lr=0.01",
    )
    result = fit(load_config(None, args))
    assert result["metrics"]["count"] == 12  # data.val_fraction=0.1 of the one pool
    assert result["metrics"]["acc"] > 0.6  # chance: 1/3
    saved = load_config(f"{load_config(None, args).run.output_dir}/default/config.yaml")
    assert saved.data.options.root == str(root) and saved.model.options.hidden == 16
    metrics = evaluate_checkpoint(f"{saved.run.output_dir}/default/best.pt")
    assert metrics["acc"] == result["best"]
