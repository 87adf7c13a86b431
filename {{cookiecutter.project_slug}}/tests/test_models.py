"""Every registered model runs forward and backward on inputs it is meant for: those of a
dataset it is paired with in configs/ (or its own `example_input`), else the default data.
So a model for feature rows, tokens or images passes here without editing this file."""

from __future__ import annotations

import warnings  # feature: text
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, missing_data_file

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_datasets, example_inputs, source_of
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models import MODELS, build_model
from {{ cookiecutter.package_name }}.models.zoo import Zoo  # feature: pretrained
from {{ cookiecutter.package_name }}.tasks import TASKS, build_task


def paired_config(name: str, configs: Path = CONFIGS):
    """The first config file that trains model `name` on data found here (a user's experiment
    on their own data may not be), else the defaults with that model."""
    for path in sorted(configs.rglob("*.yaml")):
        cfg = load_config(path)
        if cfg.model.name == name and not missing_data_file(cfg):
            return cfg
    return load_config(None, [f"model.name={name}"])


def inputs_and_outputs(name: str) -> tuple[torch.Tensor, int, object]:
    """A batch of 4 inputs for model `name`, its output size, and the config it comes from."""
    cfg = paired_config(name)
    example = getattr(MODELS[name], "example_input", None)
    if example is not None:
        return example(4), 5, cfg
    train, _, _ = build_datasets(cfg.data, TASKS[cfg.task.name].targets)
    task = build_task(cfg.task, source_of(train))
    return example_inputs(train, 4), task.num_outputs, cfg


# The zoo's models need their optional libraries: tests/test_zoo.py runs them.  # feature: pretrained
OWN_MODELS = sorted(name for name, model in MODELS.items() if not issubclass(model, Zoo))  # feature: pretrained
OWN_MODELS = sorted(MODELS)  # feature: !pretrained


@pytest.mark.parametrize("name", OWN_MODELS)
def test_each_model_runs_forward_and_backward_on_its_data(name, demo_data):
    x, outputs, cfg = inputs_and_outputs(name)
    model = build_model(cfg.model, x[:2], outputs)
    out = model(x)
    assert out.shape[0] == 4 and out.shape[-1] == outputs
    out.float().square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    if x.dim() == 4:  # a non-contiguous batch (e.g. permuted) must work: flatten, not view
        assert model(x.permute(0, 1, 3, 2)).shape == out.shape


def test_an_mlp_on_feature_rows_and_a_cnn_on_images():
    rows = torch.randn(3, 20)
    mlp = build_model(load_config(None, ["model.name=mlp"]).model, rows, 3)
    assert mlp(rows).shape == (3, 3)
    images = torch.randn(3, 1, 16, 16)
    assert build_model(load_config(None).model, images, 7)(images).shape == (3, 7)


# >>> text
@pytest.mark.filterwarnings("ignore:`torch.jit.trace.* is deprecated:DeprecationWarning")
def test_the_transformer_traces_without_a_warning():
    """torch.jit.trace follows the transformer with no TracerWarning: a tensor read as a
    Python bool, or a loop over a tensor, would be frozen into the trace. The trace answers
    as the model does at another length than the one traced."""
    cfg = load_config(None, ["model.name=transformer", "model.width=16", "model.depth=1"])
    model = build_model(cfg.model, torch.zeros(2, 8, dtype=torch.long), 11).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, torch.zeros(2, 8, dtype=torch.long))
    tokens = torch.randint(0, 11, (3, 5))
    torch.testing.assert_close(traced(tokens), model(tokens))
# <<< text


def test_a_cnn_on_feature_rows_is_refused_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"cannot run on inputs of shape \(20,\).*model.name=mlp"
    ):
        build_model(load_config(None).model, torch.randn(2, 20), 3)


def test_a_users_experiment_without_its_data_pairs_no_model(tmp_path, demo_data):
    """A user's experiment file on data not here is passed over, not built."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "default.yaml").write_text((CONFIGS / "default.yaml").read_text())
    for path in (CONFIGS / "experiments").glob("*.yaml"):
        (tmp_path / "experiments" / path.name).write_text(path.read_text())
    (tmp_path / "experiments" / "a_wine.yaml").write_text(
        "extends: ../default.yaml\ndata:\n  name: csv\n  path: data/wine.csv\n"
        "model:\n  name: mlp\n"
    )
    assert paired_config("mlp", tmp_path) == paired_config("mlp")
