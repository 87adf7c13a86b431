"""Model registry. To add a model: write models/<name>.py, then add one line to MODELS."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig, closest
from ..errors import ConfigError, first_line, is_out_of_memory
from .cnn import SmallCNN
from .mlp import MLP

MODELS = {
    "cnn": SmallCNN,
    "mlp": MLP,
}


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Every model takes the input shape (C, H, W), the class count and the ModelConfig fields.

    The model is tried on a batch of two zero samples before it is returned, so a model that
    cannot run on this data (a cnn too deep for small images, a cnn on feature vectors) or
    does not fit in memory is reported here, naming the keys, before a run writes anything."""
    if cfg.name not in MODELS:
        raise ConfigError(
            f"model.name={cfg.name!r} is not a model; choose from {_choices(cfg.name)}"
        )
    settings = f"model.name={cfg.name} (model.width={cfg.width}, model.depth={cfg.depth})"
    try:
        model = MODELS[cfg.name](
            input_shape, num_classes, width=cfg.width, depth=cfg.depth, dropout=cfg.dropout
        )
        _try_forward(model, input_shape)
    except (RuntimeError, MemoryError) as exc:
        if is_out_of_memory(exc) or "overflow" in str(exc).lower():
            raise ConfigError(
                f"{settings} with {num_classes} classes does not fit in memory "
                f"({first_line(exc)}); lower model.width or model.depth"
            ) from exc
        fixes = "lower model.depth or use larger inputs (data.image_size)"
        if cfg.name != "mlp":
            fixes += ", or use model.name=mlp, which takes inputs of any shape"
        raise ConfigError(
            f"{settings} cannot run on inputs of shape {tuple(input_shape)} from the data: "
            f"{first_line(exc)}; {fixes}"
        ) from exc
    return model


@torch.no_grad()
def _try_forward(model: nn.Module, input_shape: tuple[int, ...]) -> None:
    # Eval mode: BatchNorm keeps its running statistics and dropout draws no random numbers,
    # so the check changes neither the model nor the RNG streams of the run.
    model.eval()
    try:
        model(torch.zeros(2, *input_shape))
    finally:
        model.train()


def _choices(name: str) -> str:
    close = closest(name, MODELS)
    listed = ", ".join(MODELS)
    return f"{listed} (did you mean {close!r}?)" if close else listed
