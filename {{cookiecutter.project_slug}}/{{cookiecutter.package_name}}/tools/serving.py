"""What an exported artifact computes and promises: the model with the preprocessing it was
trained with around it, so a caller outside this project gives raw inputs and reads outputs in
their own units; and the description of both that export.py writes into the artifact's JSON.
"""

from __future__ import annotations

import math  # feature: images

import torch
from torch import nn

from .inference import Trained

TOKENIZER_SUFFIX = ".tokenizer.json"  # beside an artifact of a text model: its tokenizer  # feature: text


class Serving(nn.Module):
    """The model as a caller outside this project uses it: raw inputs standardised with the
    training data's statistics (CSV columns, image channels), and the outputs decoded as the
    task decodes them for predict.py (`head`: regression's targets mapped back to their
    units, a sigmoid per label; none for logits)."""

    def __init__(
        self, model: nn.Module, inputs=None, head: nn.Module | None = None, positions=None
    ):
        super().__init__()
        self.model = model
        self.head = head
        self.positions = positions  # the longest input of variable length; exporters read it
        mean, std = (t.float() for t in inputs) if inputs else (None, None)
        self.register_buffer("in_mean", mean)
        self.register_buffer("in_std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_mean is not None:  # (N, F) - (F,), or (N, 3, S, S) - (3, 1, 1)
            x = (x - self.in_mean) / self.in_std
        y = self.model(x)
        return y if self.head is None else self.head(y)

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs (standardised) back to what a caller gives the artifact."""
        return x if self.in_mean is None else x * self.in_std + self.in_mean


class Decode(nn.Module):
    """A task's `decode` as a module, for a task without `head()`: what predict.py applies
    to the model's outputs is inside the artifact for every task."""

    def __init__(self, task):
        super().__init__()
        self.decode = task.decode

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.decode(y)


def serving_model(trained: Trained) -> Serving:
    """What the artifact computes: the model with its preprocessing and decoding around it."""
    meta, inputs, task = trained.meta, None, trained.task
    if "mean" in meta and "std" in meta:  # CSV features (F,) or image channels (3,)
        shape = (-1, 1, 1) if "image_size" in meta else (-1,)  # feature: images
        shape = (-1,)  # feature: !images
        inputs = (torch.tensor(meta["mean"]).view(shape), torch.tensor(meta["std"]).view(shape))
    head = task.head() if hasattr(task, "head") else Decode(task)
    return Serving(trained.model, inputs, head, max_positions(trained)).eval()


def max_positions(trained: Trained) -> int | None:
    """A language model takes 1 to this many positions (model.max_len; the training length for  # feature: text
    a model that does not say), tokenised text its max_length; None for fixed sample shapes."""  # feature: text
    """None: the sample shape is fixed (no input of variable length in this project)."""  # feature: !text
    # >>> text
    if "tokenizer" in trained.meta:  # tokenised text: up to its max_length
        return int(trained.meta["max_length"])
    if trained.cfg.task.name != "language_model":
        return None
    return int(getattr(trained.model, "max_len", trained.io["input_shape"][0]))
    # <<< text
    return None  # feature: !text


def parity_inputs(model: Serving, x: torch.Tensor) -> list[torch.Tensor]:
    """What the parity check runs: `x`, and for inputs of variable length the same tokens at
    other lengths too, a short prompt and (by repeating the windows) the longest input."""
    if model.positions is None:
        return [x]
    length = x.shape[1]
    inputs = [x, x[:, : max(1, length // 3)]]
    if model.positions > length:
        inputs.append(x.repeat(1, -(-model.positions // length))[:, : model.positions])
    return inputs


def contract(trained: Trained) -> dict:
    """What goes in and comes out of the artifact: names, shapes, dtypes, units."""
    positions = max_positions(trained)
    shape = ["batch", *trained.io["input_shape"]] if positions is None else ["batch", "positions"]
    spec = {"name": "input", "shape": shape, "dtype": trained.io["input_dtype"]}
    if positions is not None:
        spec["positions"] = {"min": 1, "max": positions}
    if isinstance(trained.meta.get("features"), list):  # a table: its columns, for programs
        spec["columns"] = list(trained.meta["features"])
    spec["preprocessing"] = image_steps(trained.meta)  # feature: images
    return {"input": {**spec, "units": input_units(trained.meta)}, "output": output_spec(trained)}


# >>> images
def image_steps(meta: dict) -> dict | None:
    """What the caller does to an image file before the artifact, as numbers a program can
    copy (data/image_decode.py's decode, step by step): a reimplementation from these alone
    gives predict.py's inputs exactly. None for inputs that are not images."""
    if "image_size" not in meta or "mean" not in meta:
        return None
    size, crop = meta["image_size"], meta.get("crop_pct")
    steps = {
        "decode": "Pillow; 8-bit modes convert('RGB') (alpha dropped); one-channel 16-bit "
        "(I;16) and I: value / 65535, grey in 3 channels; F: as it is",
        "interpolation": meta.get("interpolation") or "bilinear",  # Pillow's Resampling name
        "scale": {"8-bit": 255, "16-bit": 65535},  # values / scale: floats in [0, 1]
        "layout": "float32 (batch, 3, height, width), channels in RGB order",
        "normalisation": "inside the artifact: (x - mean) / std per channel",
        "mean": list(meta["mean"]),
        "std": list(meta["std"]),
    }
    if crop is None:  # the whole image squashed to the square
        return {**steps, "resize": {"width": size, "height": size}}
    short = math.floor(size / crop + 1e-9)
    return {
        **steps,
        # The short side to `short_side`, the long one to int(short_side * long / short),
        # truncated (each at least `crop`), then the centre crop x crop box whose left and top
        # are round((resized side - crop) / 2), Python's round: halves to even.
        "resize": {"short_side": short, "long_side": "int(short_side * long / short)"},
        "crop": {"size": size, "offset": "round((resized_side - size) / 2), halves to even"},
    }
# <<< images


def input_units(meta: dict) -> str:
    """What a caller feeds the artifact: the preprocessing inside it is not theirs to do."""
    inside = "the training data's standardisation is inside the artifact"
    if "features" in meta:
        return f"raw CSV columns {', '.join(meta['features'])} in this order, as numbers; {inside}"
    # >>> images
    if "image_size" in meta and "mean" in meta:
        size, crop, how = meta["image_size"], meta.get("crop_pct"), meta.get("interpolation")
        resize = f"resized to {size}x{size}"
        if crop is not None:  # as torchvision's and timm's evaluation transforms
            short = math.floor(size / crop + 1e-9)  # data/image_decode.py's centre_crop
            resize = f"short side resized to {short}, centre {size}x{size} cut out"
        return (
            f"RGB images, channels first, {resize} ({how or 'bilinear'}) and scaled to [0, 1] "
            f"by the caller (8-bit values / 255, 16-bit / 65535; resizing is not in the "
            f"artifact); the normalisation (mean "
            f"{meta['mean']}, std {meta['std']}) is inside the artifact"
        )
    # <<< images
    # >>> text
    if "vocab" in meta:
        return "int64 token ids: positions in `vocab`, one character each"
    if "tokenizer" in meta:
        return (
            f"int64 token ids from the tokenizer shipped beside the artifact ("
            f"{TOKENIZER_SUFFIX}, special tokens added, at most {meta['max_length']}), padded "
            f"with {meta['pad_id']}, which the model leaves out"
        )
    # <<< text
    return "the values of the training data's x as they are (nothing was learnt from them)"


def output_spec(trained: Trained) -> dict:
    """The task's own description of its output (tasks/: `describe()`), or, for a task
    without one, its decoded outputs by shape: never another task's wording."""
    task = trained.task
    if hasattr(task, "describe"):
        return {"name": "output", **task.describe()}
    units = f"task.name={trained.cfg.task.name}'s outputs as its decode() gives them"
    return {"name": "output", "shape": ["batch", trained.io["num_outputs"]], "units": units}
