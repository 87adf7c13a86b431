"""predict.py's readers of text for a text classifier (data.name=text_table): a CSV with the
training text column (its label column optional), or .txt files (one text each), tokenised
with the tokenizer the checkpoint carries and padded to the longest."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.text_table import Options, read_texts, tokenize
from ..errors import ConfigError
from .inference import Trained


def read_text_csv(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, token ids (N, T), labels or None) of the CSV's text column."""
    opts = trained.cfg.data.options
    if not isinstance(opts, Options):
        raise ConfigError(f"CSV file {str(path)!r}: checkpoint {trained.path!r} reads no text")
    header = path.open(encoding="utf-8-sig").readline()
    has_labels = opts.label in [c.strip().strip('"') for c in header.strip().split(",")]
    # Without labels: the texts alone (read_texts wants the label column; lend it one).
    texts, labels = read_texts(path, opts) if has_labels else _texts_only(path, opts)
    known = set(trained.classes or ())
    unknown = next((label for label in labels or () if label not in known), None)
    if unknown is not None:
        raise ConfigError(
            f"CSV file {str(path)!r}: column {opts.label!r} holds class {unknown!r}, which the "
            "model does not know; fix it or drop the column"
        )
    ids = [f"{path}:{i + 2}" for i in range(len(texts))]
    return ids, padded(trained.meta, texts), labels if has_labels else None


def read_text_file(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, None]:
    """One .txt file: one text."""
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ConfigError(f"text file {str(path)!r} is empty; give it the text to classify")
    return [str(path)], padded(trained.meta, [text]), None


def padded(meta: dict, texts: list[str]) -> torch.Tensor:
    ids = tokenize(meta, texts)
    batch = torch.full((len(ids), max(map(len, ids))), meta["pad_id"], dtype=torch.int64)
    for row, tokens in zip(batch, ids, strict=True):
        row[: len(tokens)] = torch.tensor(tokens)
    return batch


def _texts_only(path: Path, opts: Options) -> tuple[list[str], None]:
    import csv

    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows or opts.text_column not in rows[0]:
        raise ConfigError(f"CSV file {str(path)!r} has no column {opts.text_column!r} of texts")
    texts = [(row[opts.text_column] or "").strip() for row in rows]
    return texts, None
