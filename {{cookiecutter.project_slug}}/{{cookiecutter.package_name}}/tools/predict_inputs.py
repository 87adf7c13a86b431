"""Readers of predict.py's inputs: each turns files into (ids, inputs, labels) with the
preprocessing saved in the checkpoint's data meta, and refuses what it cannot read right
(columns, values, labels the model does not know) on one line naming the file, row and column;
check_inputs reads them all and checks them against the checkpoint before the model runs."""

from __future__ import annotations

import csv
import math
import pickle
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from ..data import example_batch
from ..data.label_sets import joined, table_labels  # feature: multilabel
from ..data.targets import is_number
from ..errors import ConfigError
from .inference import Trained, validation_set
from .predict_images import images_in, is_image, read_images  # feature: images
# >>> pretrained
from .predict_text import read_text_csv, read_text_file  # feature: text
# <<< pretrained

SAVE = "the inputs with torch.save, in a dict with the key 'x'"
FIELD_LIMIT = 65536  # characters in one CSV field: more is an unclosed quote, not a number
# The files predict.py reads, for the line refusing any other.
KINDS = ".csv tables, .pt tensor files"
KINDS += ", images or folders of images"  # feature: images
KINDS += " (or --prompt for a language model)"  # feature: text


def _short(value: str, limit: int = 40) -> str:
    """A quoted value short enough for a one-line message."""
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


def _table(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, non-blank rows) of a CSV file: UTF-8, fields bounded, column names unique."""
    name, limit = f"CSV file {str(path)!r}", csv.field_size_limit(FIELD_LIMIT)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = [row for row in csv.reader(f) if row]
    except UnicodeDecodeError:
        raise ConfigError(f"{name} is not UTF-8 text; save it as UTF-8") from None
    except csv.Error as exc:
        raise ConfigError(
            f"{name} cannot be read ({str(exc)[:80]}): a field over {FIELD_LIMIT} characters "
            "is an unclosed quote or not a table; fix the file"
        ) from None
    finally:
        csv.field_size_limit(limit)
    if len(rows) < 2:
        raise ConfigError(f"{name} needs a header row and at least one data row")
    header = [column.strip() for column in rows[0]]
    twice = next((c for c, n in Counter(header).items() if n > 1), None)
    if twice is not None:
        raise ConfigError(f"{name} has the column {_short(twice)} twice; rename or drop one")
    return header, rows[1:]


def read_csv(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, inputs (N, F), labels or None) of a table with the training table's columns."""
    meta, name = trained.meta, f"CSV file {str(path)!r}"
    # >>> pretrained
    if "tokenizer" in meta:  # texts to classify: their column, tokenised as in training  # feature: text
        return read_text_csv(path, trained)  # feature: text
    # <<< pretrained
    if "features" not in meta:
        raise ConfigError(
            f"{name}: checkpoint {trained.path!r} was not trained on a CSV table (its data "
            "meta names no feature columns); give it inputs like its training data"
        )
    header, rows = _table(path)
    missing = [c for c in meta["features"] if c not in header]
    if missing:
        raise ConfigError(
            f"{name} lacks the feature column {missing[0]!r} the model was trained on (it "
            f"needs {', '.join(meta['features'])})"
        )
    at = {column: i for i, column in enumerate(header)}
    columns, values = [at[c] for c in meta["features"]], []
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ConfigError(
                f"{name} line {line} has {len(row)} fields, the header {len(header)}; fix that row"
            )
        values.append([_number(row[i], name, line, header[i]) for i in columns])
    x = torch.tensor(values, dtype=torch.float32)
    x = (x - torch.tensor(meta["mean"])) / torch.tensor(meta["std"])
    label, ids = meta.get("label"), [f"{path}:{i + 2}" for i in range(len(rows))]  # file:line
    if isinstance(meta.get("labels"), list):  # multi-label: each row's labels, joined # feature: multilabel
        return ids, x, table_labels(header, rows, meta, path)  # feature: multilabel
    labels = [row[at[label]].strip() for row in rows] if label in at else None
    if labels is not None:
        _check_labels(labels, meta.get("classes"), name, label)
    return ids, x, labels


def _number(text: str, name: str, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{name} line {line}: column {column!r} holds {_short(text)}, not a number; "
            "fill or drop that value"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(
            f"{name} line {line}: column {column!r} holds {_short(text)}; nan and inf are "
            "not predicted: fill or drop that value"
        )
    return value


def _check_labels(labels: list[str], classes: list | None, name: str, column: str) -> None:
    """Labels the model cannot score are refused: an accuracy against them would mislead."""
    for line, label in enumerate(labels, start=2):
        if label and classes and label not in classes:
            raise ConfigError(
                f"{name} line {line}: column {column!r} holds class {_short(label)}, which the "
                f"model does not know ({', '.join(classes)[:200]}); fix it or drop the column"
            )
        if label and not classes and not is_number(label):
            raise ConfigError(
                f"{name} line {line}: column {column!r} holds {_short(label)}, not a number "
                "(the model predicts numbers); fix it or drop the column"
            )


def read_tensors(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, inputs, labels or None) of a torch.save file: {"x": ..., "y": ...} or a tensor."""
    name = f"tensor file {str(path)!r}"
    if "mean" in trained.meta or "features" in trained.meta:
        kind = "a CSV table" if "features" in trained.meta else "image files"
        raise ConfigError(
            f"{name}: checkpoint {trained.path!r} was trained on {kind}, whose inputs it "
            f"standardises; give it {kind} (a .pt file would skip that step)"
        )
    blob = _load(path, name)
    x = blob.get("x") if isinstance(blob, dict) else blob
    if not isinstance(x, torch.Tensor):
        keys = sorted(map(str, blob))[:10] if isinstance(blob, dict) else type(blob).__name__
        raise ConfigError(f"{name} holds {keys}, not a tensor 'x'; save {SAVE}")
    if x.dtype in (torch.float64, torch.float16, torch.bfloat16):
        x = x.float()  # as training reads tensor files
    if x.dim() == len(trained.io["input_shape"]):  # (N, H, W) grayscale: as tensor_files does
        x = x.unsqueeze(1)
    y = blob.get("y") if isinstance(blob, dict) else None
    labels = _labels(y, trained, name, len(x)) if y is not None else None
    return [f"{path}:{i}" for i in range(len(x))], x, labels


def _load(path: Path, name: str):
    """torch.load with weights_only=True; a text, pickled or truncated file is one line."""
    with path.open("rb") as f:
        if f.read(2) not in (b"PK", b"\x80\x02"):  # torch.save's zip, or its legacy pickle
            raise ConfigError(f"{name} is not a file written by torch.save; save {SAVE}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise  # unreadable (permissions): the entry point names the path and the fix
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower():
            raise ConfigError(
                f"{name} holds pickled Python objects, which are not loaded (code could run); "
                f"save plain tensors: {SAVE}"
            ) from None
        problem = "is not a file written by torch.save"
    except Exception:  # text, not a zip archive, truncated: each fails differently
        problem = "is not a file written by torch.save, or it is truncated"
    raise ConfigError(f"{name} {problem}; save {SAVE}")


def _labels(y, trained: Trained, name: str, n: int) -> list:
    """Label texts of `y`: class names of a classifier's ids 0..K-1, else the values."""
    if not isinstance(y, torch.Tensor) or len(y) != n or y.dtype in (torch.bool, torch.uint8):
        what = f"{len(y)} labels" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ConfigError(f"{name}: y is {what} for {n} inputs; give one label per input")
    if trained.classes:
        k = len(trained.classes)
        if y.is_floating_point() or y.is_complex() or y.dim() != 1:
            raise ConfigError(
                f"{name}: y is {y.dtype} of shape {tuple(y.shape)}; the model is a classifier: "
                f"give class ids 0..{k - 1}, shape (N,)"
            )
        if len(y) and not 0 <= int(y.min()) <= int(y.max()) < k:
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            raise ConfigError(
                f"{name}: y holds class {bad}, but the model has classes 0..{k - 1} only; "
                "fix the labels or leave y out"
            )
        return [trained.classes[i] for i in y.tolist()]
    values = y.view(n, -1).tolist()
    # >>> multilabel
    if trained.task.targets == "labels" and values:  # multi-label: 0/1 per label, joined
        names = trained.task.label_names
        if len(values[0]) == len(names) and all(v in (0, 1) for v in values[0]):
            return [joined(names, row) for row in values]
    # <<< multilabel
    if values and len(values[0]) != trained.io["num_outputs"]:
        raise ConfigError(
            f"{name}: y has {len(values[0])} values per input, the model predicts "
            f"{trained.io['num_outputs']}; fix the labels or leave y out"
        )
    return [" ".join(f"{v:g}" for v in row) for row in values]


def read_split(trained: Trained) -> tuple[list[str], torch.Tensor, list]:
    """(ids, inputs, labels) of the training run's validation split."""
    val = validation_set(trained)
    x, y = example_batch(val, len(val))  # texts: padded to the longest
    return [f"val:{i}" for i in range(len(val))], x, _labels(y, trained, "", len(y))


class Inputs(NamedTuple):
    name: str  # for messages: "CSV file 'new.csv'"
    ids: list[str]  # one per row of x: file:line, file:index, image path, val:index
    x: torch.Tensor  # (N, ...) as the model takes them
    labels: list | None  # one per row ("" = unknown), or None


def inputs_of(names: list[str], trained: Trained) -> Iterator[Inputs]:
    """One Inputs per table or tensor file, and one for all images: the reader is chosen by # feature: images
    the file type; a folder stands for the images in it.""" # feature: images
    """One Inputs per table or tensor file: the reader is chosen by the file type.""" # feature: !images
    images = []  # feature: images
    for name in names:
        path, suffix = Path(name), Path(name).suffix.lower()
        if path.is_dir():  # feature: images
            images += images_in(path)  # feature: images
        elif not path.is_file():  # feature: images
        if not path.is_file():  # feature: !images
            problem = "is not a file" if path.exists() else "not found"
            raise ConfigError(f"input {name!r} {problem}")
        elif suffix == ".csv":
            yield Inputs(f"CSV file {name!r}", *read_csv(path, trained))
        # >>> pretrained
        elif suffix == ".txt" and "tokenizer" in trained.meta:  # feature: text
            yield Inputs(f"text file {name!r}", *read_text_file(path, trained))  # feature: text
        # <<< pretrained
        elif suffix in (".pt", ".pth"):
            yield Inputs(f"tensor file {name!r}", *read_tensors(path, trained))
        elif is_image(path):  # feature: images
            images.append(path)  # feature: images
        else:
            raise ConfigError(f"input {name!r}: unknown file type; give {KINDS}")
    if images:  # feature: images
        yield Inputs(f"image file {str(images[0])!r}", *read_images(images, trained))  # feature: images


def check_inputs(trained: Trained, names: list[str], split: str | None) -> list[Inputs]:
    """Every input read and checked against the checkpoint's io before the model runs: the
    readers check columns, values and labels; here the sample shape and dtype, and that
    every value is finite."""
    if names and split:
        raise ConfigError(f"--split {split} reads the run's own split: leave out {names[0]!r}")
    if not names and not split:
        raise ConfigError("no inputs given: pass files or folders, --split val, or --prompt")  # feature: text
        raise ConfigError("no inputs given: pass files or folders, or --split val")  # feature: !text
    sources = [Inputs("the validation split", *read_split(trained))] if split else []
    sources += inputs_of(names, trained)
    io = trained.io
    floats = getattr(torch, io["input_dtype"]).is_floating_point
    shape = tuple(io["input_shape"])
    fix = "x.float() (x.float() / 255 for 8-bit images)" if floats else "x.long()"
    for name, ids, x, _ in sources:
        if len(x) == 0:
            raise ConfigError(f"{name} holds no inputs; give it at least one")
        if x.is_floating_point() != floats or x.dtype == torch.bool or x.is_complex():
            raise ConfigError(
                f"{name}: x is {str(x.dtype).removeprefix('torch.')}, the model takes "
                f"{io['input_dtype']}; convert it once, e.g. {fix}"
            )
        got = tuple(x.shape[1:])  # -1 in the model's shape: any length (text)
        if len(got) != len(shape) or any(b not in (a, -1) for a, b in zip(got, shape)):  # noqa: B905
            raise ConfigError(
                f"{name}: inputs of shape {got}, the model takes {shape} "
                "(x is (N, *shape)); give inputs like its training data"
            )
        if floats and not torch.isfinite(x).all():
            bad = ids[int((~torch.isfinite(x.reshape(len(x), -1))).any(1).nonzero()[0])]
            raise ConfigError(f"{name}: input {bad} holds nan or inf; fix or drop it")
    return sources
