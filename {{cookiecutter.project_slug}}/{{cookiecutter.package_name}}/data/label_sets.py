"""Multi-label targets as a float 0/1 matrix (N, L): a table's several 0/1 columns or one
column of label names joined by a separator (data/csv_table.py reads the table), and an image # feature: images
folder's labels file, a CSV of `file,labels` rows (data/image_folder.py).""" # feature: images
column of label names joined by a separator (data/csv_table.py reads the table).""" # feature: !images

from __future__ import annotations

import csv  # feature: images
from pathlib import Path
from types import SimpleNamespace

import torch

from ..errors import ConfigError
from .targets import sorted_names

_TRUE, _FALSE = ("1", "1.0", "true", "yes"), ("0", "0.0", "false", "no")


def label_names(labels: list, opts) -> list[str]:
    """The labels of a multi-label table: its 0/1 columns' names, or the sorted names found
    in its one label column (joined by data.label_sep). A name holding the separator, or
    the `|` that predictions join labels with, is refused: `a|b` would read as two labels."""
    if not isinstance(opts.label, str):
        names = list(opts.label)
    else:
        names = sorted_names(
            n.strip() for text in labels for n in text.split(opts.label_sep) if n.strip()
        )
    joins = next((n for n in names if opts.label_sep in n or "|" in n), None)
    if joins is not None:
        raise ConfigError(
            f"the label {joins[:40]!r} holds {'|' if '|' in joins else opts.label_sep!r}, which "
            "joins labels (data.label_sep, and predict.py's prediction column); rename it"
        )
    return names


def label_matrix(labels: list, names: list[str], path: Path, opts) -> torch.Tensor:
    """(N, L) float 0/1 targets of multi-label rows: 0/1 columns, or joined label names."""
    rows = []
    if not isinstance(opts.label, str):  # one 0/1 column per label
        for line, values in enumerate(labels, start=2):
            bad = next((v for v in values if v.lower() not in _TRUE + _FALSE), None)
            if bad is not None:
                what = "an empty cell" if not bad else repr(bad[:40])
                raise ConfigError(
                    f"CSV file {str(path)!r} line {line}: a label column holds {what}; "
                    "multi-label columns hold 1/0 (or true/false, yes/no) in every row"
                )
            rows.append([float(v.lower() in _TRUE) for v in values])
    else:
        at = {name: i for i, name in enumerate(names)}
        for line, text in enumerate(labels, start=2):
            row = [0.0] * len(names)
            for name in (n.strip() for n in text.split(opts.label_sep)):
                if name and name not in at:
                    raise ConfigError(
                        f"CSV file {str(path)!r} line {line}: column {opts.label!r} holds the "
                        f"label {name[:40]!r}, which the training table does not have"
                    )
                if name:
                    row[at[name]] = 1.0
            rows.append(row)
    if len(names) < 1:
        raise ConfigError(
            f"CSV file {str(path)!r}: column {opts.label!r} holds no labels; give each row its "
            f"labels joined by data.label_sep={opts.label_sep!r}"
        )
    return torch.tensor(rows, dtype=torch.float32).view(len(labels), len(names))


def joined(names: list[str], row) -> str:
    """A sample's labels as text, "dog|beach" (in the labels' order): how predict.py writes
    the labels it predicts and those it is given."""
    return "|".join(name for name, on in zip(names, row, strict=True) if on)


def table_labels(header: list[str], rows: list[list[str]], meta: dict, path: Path):
    """The labels of a table's rows as text (joined), read as training read them (meta's
    label columns and separator), checked against the model's labels; None when the table
    lacks a label column."""
    label, names = meta.get("label"), meta["labels"]
    columns = [label] if isinstance(label, str) else list(label or [])
    at = {column: i for i, column in enumerate(header)}
    if not columns or any(column not in at for column in columns):
        return None
    texts = [[row[at[c]].strip() for c in columns] for row in rows]
    texts = [t[0] for t in texts] if isinstance(label, str) else texts
    opts = SimpleNamespace(label=label, label_sep=meta.get("label_sep", "|"))
    return [joined(names, row) for row in label_matrix(texts, names, path, opts).tolist()]


# >>> images
def image_labels(root: Path, table: Path, sep: str) -> tuple[list[Path], torch.Tensor, list]:
    """(image files, targets (N, L), label names) of an image folder's labels file: a CSV
    with the columns `file` (relative to `root`) and `labels` (names joined by `sep`)."""
    name = f"labels file {str(table)!r} (data.labels)"
    try:
        with table.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{name} cannot be read ({str(exc)[:80]}); give a UTF-8 CSV") from None
    if not rows or not {"file", "labels"} <= set(rows[0]):
        raise ConfigError(f"{name} needs a header 'file,labels' and one row per image")
    files = [root / row["file"].strip() for row in rows]
    seen = {}
    for line, path in enumerate(files, start=2):
        if path in seen:  # its two rows may give other labels: which holds is not known
            raise ConfigError(
                f"{name} lists {str(path)!r} twice (lines {seen[path]} and {line}); give each "
                "image one row, its labels joined by data.label_sep"
            )
        seen[path] = line
    missing = next((path for path in files if not path.is_file()), None)
    if missing is not None:
        raise ConfigError(f"{name} names {str(missing)!r}, which does not exist; fix the row")
    texts = [row["labels"] or "" for row in rows]
    opts = SimpleNamespace(label="labels", label_sep=sep)
    names = label_names(texts, opts)
    return files, label_matrix(texts, names, table, opts), names
# <<< images
