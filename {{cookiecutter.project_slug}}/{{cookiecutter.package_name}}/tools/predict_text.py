"""predict.py's readers of text for a text classifier (data.name=text_table): a CSV with the
training text column (its label column optional), or .txt files (one text each), tokenised
with the tokenizer the checkpoint carries and padded to the longest."""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.text_table import Options, pad, read_texts, tokenize
from ..errors import ConfigError
from .inference import Trained


def read_text_csv(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, list | None]:
    """(ids, token ids (N, T), labels or None) of the CSV's text column."""
    opts = trained.cfg.data.options
    if not isinstance(opts, Options):
        raise ConfigError(f"CSV file {str(path)!r}: checkpoint {trained.path!r} reads no text")
    texts, labels = read_texts(path, opts, labelled=False)  # labels: None without them
    known = set(trained.classes or ())
    unknown = next((label for label in labels or () if label not in known), None)
    if unknown is not None:
        raise ConfigError(
            f"CSV file {str(path)!r}: column {opts.label!r} holds class {unknown!r}, which the "
            "model does not know; fix it or drop the column"
        )
    ids = [f"{path}:{i + 2}" for i in range(len(texts))]
    return ids, padded(trained.meta, texts), labels


def read_text_file(path: Path, trained: Trained) -> tuple[list[str], torch.Tensor, None]:
    """One .txt file: one text."""
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ConfigError(f"text file {str(path)!r} is empty; give it the text to classify")
    return [str(path)], padded(trained.meta, [text]), None


def padded(meta: dict, texts: list[str]) -> torch.Tensor:
    return pad(tokenize(meta, texts), meta["pad_id"])
