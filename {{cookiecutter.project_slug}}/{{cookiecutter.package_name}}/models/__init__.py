"""Model registry. To add a model: write models/<name>.py, then add one line to MODELS."""

from __future__ import annotations

import difflib

from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from .cnn import SmallCNN
from .mlp import MLP

MODELS = {
    "cnn": SmallCNN,
    "mlp": MLP,
}


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Every model takes the input shape (C, H, W), the class count and the ModelConfig fields."""
    if cfg.name not in MODELS:
        raise ConfigError(
            f"model.name={cfg.name!r} is not a model; choose from {_choices(cfg.name)}"
        )
    return MODELS[cfg.name](
        input_shape, num_classes, width=cfg.width, depth=cfg.depth, dropout=cfg.dropout
    )


def _choices(name: str) -> str:
    close = difflib.get_close_matches(name, MODELS, n=1)
    listed = ", ".join(MODELS)
    return f"{listed} (did you mean {close[0]!r}?)" if close else listed
