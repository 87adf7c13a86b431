"""Every registered model maps (N, C, H, W) to (N, num_classes)."""

from __future__ import annotations

import pytest
import torch

from {{ cookiecutter.package_name }}.config import ModelConfig
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models import MODELS, build_model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("depth", [1, 3])
def test_output_shape(name, depth):
    model = build_model(ModelConfig(name=name, width=8, depth=depth), (3, 16, 16), num_classes=5)
    x = torch.randn(4, 3, 16, 16)
    assert model(x).shape == (4, 5)
    # A non-contiguous input (e.g. a permuted batch) must work: the models flatten, not view.
    assert model(x.permute(0, 1, 3, 2)).shape == (4, 5)


def test_unknown_model_names_the_choices():
    with pytest.raises(
        ConfigError, match=r"model.name='cnnn' is not a model; choose from .*'cnn'"
    ):
        build_model(ModelConfig(name="cnnn"), (3, 8, 8), 2)
