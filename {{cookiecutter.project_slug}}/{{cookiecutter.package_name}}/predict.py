"""Prediction on new inputs with a checkpoint: each input kind has a small reader, chosen by
file type, that turns files into a batch the model takes, with the preprocessing saved in the
checkpoint's data meta (never the current config):

- CSV tables (.csv): meta["features"] columns, standardised with meta["mean"] / meta["std"];
  the label column is optional (its values are copied to the output);
- tensor files (.pt): {"x": (N, ...)} (an optional "y" is copied), or a bare tensor;
- images (.png, .jpg, ... or a folder of them, Pillow): RGB, resized to meta["image_size"],
  scaled to [0, 1] and normalised with meta["mean"] / meta["std"];
- `split="val"`: the training run's validation split, rebuilt like evaluate.py does;
- a text prompt for a language model: encoded with meta["vocab"], continued by
  model.generate.

Outputs are one CSV row per input: its id, the predicted class name and its probability, or
the predicted values (regression: in the targets' units, mapped back with meta["target_mean"]
/ meta["target_std"]); plus the known label, if any.
"""

from __future__ import annotations

import csv
import io as text_io
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from .data.image_folder import EXTENSIONS, decode
from .errors import ConfigError, UserError
from .inference import Trained, load_trained, validation_set
from .utils.device import resolve_device

IMAGE_SUFFIXES = EXTENSIONS  # the files image folders train on


def read_csv(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, inputs (N, F), labels or None) of a table with the training table's columns."""
    meta = trained.meta
    if "features" not in meta:
        raise ConfigError(
            f"{str(path)!r}: checkpoint {trained.path!r} was not trained on a CSV table (its "
            "data meta names no feature columns); give it inputs like its training data"
        )
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = [row for row in csv.DictReader(f) if any(row.values())]
    header = set(rows[0]) if rows else set()
    missing = [name for name in meta["features"] if name not in header]
    if missing:
        raise ConfigError(
            f"CSV file {str(path)!r} lacks the feature column {missing[0]!r} the model was "
            f"trained on (it needs {', '.join(meta['features'])})"
        )
    try:
        x = torch.tensor([[float(row[c]) for c in meta["features"]] for row in rows])
    except (TypeError, ValueError) as exc:  # TypeError: a row shorter than the header
        raise ConfigError(
            f"CSV file {str(path)!r} holds a value that is not a number ({exc}); fix that row"
        ) from None
    x = (x - torch.tensor(meta["mean"])) / torch.tensor(meta["std"])
    label = meta.get("label")
    labels = [row[label].strip() for row in rows] if label in header else None
    return [f"{path}:{i + 2}" for i in range(len(rows))], x, labels  # ids: file:line


def read_tensors(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, inputs, labels or None) of a torch.save file: {"x": ..., "y": ...} or a tensor."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    x = blob.get("x") if isinstance(blob, dict) else blob
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"tensor file {str(path)!r} holds no tensor 'x' (nor is a tensor)")
    if x.is_floating_point():
        x = x.float()
    if x.dim() == len(trained.io["input_shape"]):  # (N, H, W) grayscale: as tensor_files does
        x = x.unsqueeze(1)
    y = blob.get("y") if isinstance(blob, dict) else None
    labels = _labels(y, trained) if isinstance(y, torch.Tensor) else None
    return [f"{path}:{i}" for i in range(len(x))], x, labels


def read_images(paths: list[Path], trained: Trained) -> tuple[list[str], torch.Tensor, list]:
    """(ids, images (N, C, S, S), labels): each image read by the training dataset's own
    decode(); its label is the name of its folder where that is one of the classes."""
    meta = trained.meta
    size = meta.get("image_size")
    if not size or "mean" not in meta:
        raise ConfigError(
            f"checkpoint {trained.path!r} was not trained on image files (its data meta has no "
            "image_size, mean and std); give it inputs like its training data"
        )
    mean = torch.tensor(meta["mean"]).view(-1, 1, 1)
    std = torch.tensor(meta["std"]).view(-1, 1, 1)
    images = [(decode(path, size) - mean) / std for path in paths]  # (3, S, S) each
    classes = set(trained.classes or ())
    labels = [p.parent.name if p.parent.name in classes else "" for p in paths]
    return [str(p) for p in paths], torch.stack(images), labels


def read_split(trained: Trained) -> tuple[list[str], torch.Tensor, list]:
    """(ids, inputs, labels) of the training run's validation split."""
    val = validation_set(trained)
    xs, ys = zip(*(val[i] for i in range(len(val))), strict=True)
    return (
        [f"val:{i}" for i in range(len(val))],
        torch.stack(xs),
        _labels(torch.stack(ys), trained),
    )


def _labels(y: torch.Tensor, trained: Trained) -> list:
    if trained.classes and not y.is_floating_point():
        return [trained.classes[i] for i in y.view(-1).tolist()]
    return [" ".join(f"{v:g}" for v in row) for row in y.view(len(y), -1).tolist()]


def inputs_of(
    names: list[str], trained: Trained
) -> Iterator[tuple[list[str], torch.Tensor, list]]:
    """One (ids, inputs, labels) per table or tensor file, and one for all images: the reader
    is chosen by the file type; a folder stands for the images in it."""
    images = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise ConfigError(
                    f"folder {name!r} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})"
                )
            images += found
        elif not path.is_file():
            raise ConfigError(f"input {name!r} not found")
        elif path.suffix.lower() == ".csv":
            yield read_csv(path, trained)
        elif path.suffix.lower() in (".pt", ".pth"):
            yield read_tensors(path, trained)
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            images.append(path)
        else:
            raise ConfigError(
                f"input {name!r}: unknown file type; give .csv tables, .pt tensor files, "
                "images or folders of images (or --prompt for a language model)"
            )
    if images:
        yield read_images(images, trained)


@torch.inference_mode()
def predict_rows(
    trained: Trained, x: torch.Tensor, device: torch.device, batch_size: int
) -> list[list]:
    """The model's predictions for `x`, batch by batch: [class name, probability] per row for
    a classifier, else its output values in the targets' units (task.decode)."""
    model, rows = trained.model.to(device), []
    for start in range(0, len(x), batch_size):
        output = trained.task.decode(model(x[start : start + batch_size].to(device))).cpu()
        if trained.classes:
            prob, index = output.float().softmax(-1).max(-1)
            rows += [
                [trained.classes[i], round(p, 6)]
                for i, p in zip(index.tolist(), prob.tolist(), strict=True)
            ]
        else:
            rows += [[round(v, 6) for v in row] for row in output.view(len(output), -1).tolist()]
    return rows


def predict(
    checkpoint: str,
    inputs: list[str],
    split: str | None = None,
    out: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
) -> dict:
    """Predict every input; write the CSV to `out` (stdout when None). Returns
    {"rows": n, "accuracy": of labelled classification rows, else None}."""
    trained = load_trained(checkpoint)
    if trained.cfg.task.name == "language_model":
        raise ConfigError(f"checkpoint {checkpoint!r} is a language model: pass --prompt TEXT")
    if not inputs and not split:
        raise ConfigError("no inputs given: pass files or folders, --split val, or --prompt")
    target = resolve_device(device)
    sources = [read_split(trained)] if split else inputs_of(inputs, trained)
    outputs = trained.io["num_outputs"]
    values = ["prediction"] if outputs == 1 else [f"prediction_{i}" for i in range(outputs)]
    header = ["prediction", "probability"] if trained.classes else values
    table, correct, labelled = [], 0, 0
    for ids, x, labels in sources:
        for i, row in enumerate(predict_rows(trained, x, target, batch_size)):
            label = labels[i] if labels else ""
            table.append([ids[i], *row, label])
            if label != "" and trained.classes:
                labelled += 1
                correct += row[0] == label
    buffer = text_io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["input", *header, "label"])
    writer.writerows(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(buffer.getvalue())
    else:
        sys.stdout.write(buffer.getvalue())
    return {"rows": len(table), "accuracy": correct / labelled if labelled else None}


def generate(
    checkpoint: str,
    prompt: str,
    tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    device: str = "auto",
) -> str:
    """The prompt continued by `tokens` tokens of the checkpoint's language model."""
    trained = load_trained(checkpoint)
    vocab = trained.meta.get("vocab") or trained.meta.get("vocabulary")
    if not vocab or not hasattr(trained.model, "generate"):
        raise ConfigError(
            f"checkpoint {checkpoint!r} is not a language model with a vocabulary and "
            "generate(); --prompt needs one (other models take files)"
        )
    index = {token: i for i, token in enumerate(vocab)}
    unknown = next((c for c in prompt if c not in index), None)
    if unknown is not None or not prompt:
        what = f"the character {unknown!r}" if prompt else "nothing"
        raise UserError(f"the prompt holds {what}, which the model's vocabulary lacks")
    target = resolve_device(device)
    idx = torch.tensor([[index[c] for c in prompt]], device=target)
    out = trained.model.to(target).generate(idx, tokens, temperature=temperature, top_k=top_k)
    return "".join(vocab[i] for i in out[0].tolist())
