"""Model registry. To add a model: write models/<name>.py, then add one line to MODELS. Also
a model's blocks, the unit of fsdp's sharding and of activation checkpointing (blocks(); the  # feature: fsdp
a model's blocks, the unit of activation checkpointing (blocks(); the  # feature: !fsdp
checkpointing itself is activation_checkpointing.py's).

A model class takes `(input_shape, num_outputs, opts)`: the shape of one input sample (e.g.
(C, H, W), (F,) or (T,) for token ids), the size of its output's last dimension (classes,
targets or vocabulary, from the task) and its `Options` dataclass (its keys in the config's
`model:` section, beside `name`). It returns (N, num_outputs) or, for sequences, (N, T,
num_outputs). Models that only run on certain data may set `example_input`, a function of the
batch size giving an input they accept; tests/test_models.py feeds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch
from torch import nn

from ..config.text import did_you_mean
from ..errors import ConfigError, first_line, is_out_of_memory
from ..registry import Registry

MODELS = Registry(
    __name__,
    cnn=".cnn:SmallCNN",
    mlp=".mlp:MLP",
    transformer=".transformer:Transformer",  # feature: text
    # >>> pretrained
    timm=".zoo:Timm",  # pretrained zoo models (optional libraries): models/zoo.py
    torchvision=".zoo:Torchvision",
    hf=".hf:HFText",  # Hugging Face sequence classifiers: models/hf.py  # feature: text
    hf_image=".hf:HFImage",  # Hugging Face image classifiers: models/hf.py
    # <<< pretrained
)


def architecture(cfg):
    """cfg (the config's model section) without pretrained weights: for rebuilding a model
    whose weights come from a checkpoint (a resume, or a tool: evaluation, prediction), which
    then needs neither the network nor the weights file."""
    if getattr(cfg.options, "pretrained", False):
        return replace(cfg, options=replace(cfg.options, pretrained=False))
    return cfg


def preprocessing(cfg) -> dict | None:
    """How a pretrained model's weights expect their inputs (image size, crop, interpolation,
    mean, std), for the data options left at auto; None for models trained from scratch."""
    own = getattr(MODELS.get(cfg.name), "preprocessing", None)
    return own(cfg.options) if own is not None else None


def build_model(cfg, example: torch.Tensor, num_outputs: int) -> nn.Module:
    """The model of cfg (the config's model section) for inputs like `example` (a batch of
    real samples, on the CPU).

    The model runs on `example` before it is returned, so a model that cannot run on this data
    (a cnn too deep for small images, a cnn on feature rows) or does not fit in memory is
    reported here, naming the keys, before a run writes anything."""
    if cfg.name not in MODELS:
        raise ConfigError(
            f"model.name={cfg.name!r} is not a model; choose from {_choices(cfg.name)}"
        )
    options = ", ".join(f"model.{k}={v}" for k, v in vars(cfg.options).items())
    settings = f"model.name={cfg.name}" + (f" ({options})" if options else "")
    shape = tuple(example.shape[1:])
    try:
        model = MODELS[cfg.name](shape, num_outputs, cfg.options)
        # >>> fsdp
        if example.is_meta:  # fsdp's layout: the model built on the CPU was tried already
            return model
        # <<< fsdp
        output = _try_forward(model, example)
    except (RuntimeError, MemoryError, ValueError, IndexError, AssertionError) as exc:
        if is_out_of_memory(exc) or "overflow" in str(exc).lower():
            raise ConfigError(
                f"{settings} with {num_outputs} outputs does not fit in memory "
                f"({first_line(exc)}); lower {_size_keys(cfg)}"
            ) from exc
        fixes = getattr(MODELS[cfg.name], "input_fix", "change the model's options or the data")
        if cfg.name in ("cnn", "transformer") and example.is_floating_point():  # feature: text
        if cfg.name == "cnn" and example.is_floating_point():  # feature: !text
            fixes += ", or use model.name=mlp, which takes inputs of any shape"
        raise ConfigError(
            f"{settings} cannot run on inputs of shape {shape} ({example.dtype}) from the "
            f"data: {first_line(exc)}; {fixes}"
        ) from exc
    if output.shape[-1] != num_outputs:
        raise ConfigError(
            f"{settings} returns outputs of shape {tuple(output.shape)}, but the task needs "
            f"{num_outputs} in the last dimension; its last layer must take num_outputs"
        )
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, the unit of sharding and of activation checkpointing.  # feature: fsdp
    """The model's repeated blocks, the unit of activation checkpointing.  # feature: !fsdp

    A model may name them with a method `block_units()`. Otherwise they are the children of an
    nn.Sequential or nn.ModuleList that repeat one class and hold parameters (SmallCNN's
    ConvBlocks, the MLP's Linear layers), outermost first: a block's insides are not searched.
    """
    declared = getattr(model, "block_units", None)
    if callable(declared):
        return list(declared())
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        children = [c for c in module.children() if next(c.parameters(), None) is not None]
        if isinstance(module, (nn.Sequential, nn.ModuleList)):
            counts = Counter(type(child) for child in children)
            found.extend(child for child in children if counts[type(child)] > 1)
            children = [child for child in children if counts[type(child)] == 1]
        for child in children:
            visit(child)

    visit(model)
    return found


def model_io(example: torch.Tensor, num_outputs: int, dataset=None) -> dict:
    """What the model takes and gives, saved in checkpoints ("io"): the tools
    rebuild the model from it without the training data. A dataset whose samples have their
    own lengths (`variable_length`) gives -1 for the length: any length up to the maximum."""
    shape = list(example.shape[1:])
    if getattr(dataset, "variable_length", False):
        shape[-1] = -1
    return {
        "input_shape": shape,
        "input_dtype": str(example.dtype).removeprefix("torch."),
        "num_outputs": num_outputs,
    }


def example_of(io: dict, n: int = 2) -> torch.Tensor:
    """A batch of `n` zero inputs of the shape and dtype in `io` (see model_io); 8 positions
    where the length varies."""
    shape = [8 if size == -1 else size for size in io["input_shape"]]
    return torch.zeros((n, *shape), dtype=getattr(torch, io["input_dtype"]))


@torch.no_grad()
def _try_forward(model: nn.Module, example: torch.Tensor) -> torch.Tensor:
    # Eval mode: BatchNorm keeps its running statistics and dropout draws no random numbers,
    # so the check changes neither the model nor the RNG streams of the run.
    model.eval()
    try:
        return model(example)
    finally:
        model.train()


def _size_keys(cfg) -> str:
    sizes = [f"model.{k}" for k, v in vars(cfg.options).items() if type(v) is int]
    return " or ".join(sizes) or "the model's size"


def _choices(name: str) -> str:
    return ", ".join(MODELS) + did_you_mean(name, MODELS)
