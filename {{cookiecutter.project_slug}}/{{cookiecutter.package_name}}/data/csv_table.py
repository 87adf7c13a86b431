"""A CSV table: numeric feature columns and one label column, for classification or regression.

    data:
      name: csv
      path: data/table.csv      # header row first; data.val_fraction of it validates
      label: species            # the target column; every other column is a feature
    task:
      name: classification      # or regression (numeric labels)

Labels are class names or numbers for classification (ids follow the sorted names) and numbers
for regression. # feature: !multilabel
# >>> multilabel
for regression. Multi-label (task.name=multilabel) reads either several 0/1 columns
(`label: [beach, dog, sunset]`; 1/0, true/false, yes/no) or one column of label names joined
by `label_sep` (`dog|beach`, empty for none; the labels are the training table's, sorted).
# <<< multilabel
Features are standardised with the mean and standard deviation of the
training rows only (a constant column's std counts as 1); those statistics, the feature names
and the class names travel in every checkpoint (`meta`), so evaluation and prediction read
new rows the same way. Columns are matched by name: a resumed or fine-tuned run, an
evaluation, and a validation table (`val_path`) read a table whose columns are in another
order as the model reads them, and refuse one whose feature names differ. Regression targets
are standardised too, by the task, with statistics of the training rows (`target_mean`,
`target_std` in the meta; see data/__init__.py).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..errors import ConfigError
from .in_memory import InMemoryDataset, mean_and_std
from .label_sets import label_matrix, label_names  # feature: multilabel
from .targets import is_number, sorted_names


@dataclass
class Options:
    path: str = "data/train.csv"  # the table (header row first)
    val_path: str = ""  # a separate validation table with the same columns; "" = hold out
    # A held-out test table (same columns): never trained on nor used to choose best.pt;
    # scored once at the end of training and by evaluate.py --split test
    test_path: str = ""
    # >>> multilabel
    # The target column; multi-label: a list of 0/1 columns, or one column of joined labels
    label: str | list[str] = "label"
    label_sep: str = "|"  # multi-label from one column: the separator between its labels
    features: str = ""  # comma-separated feature columns; "" = every column but the labels
    targets: Literal["auto", "class", "value", "labels"] = "auto"  # auto: what task.name needs
    # <<< multilabel
    # >>> !multilabel
    label: str = "label"  # the target column
    features: str = ""  # comma-separated feature columns; "" = every column but the label
    targets: Literal["auto", "class", "value"] = "auto"  # auto: what task.name needs
    # <<< !multilabel
    normalize: bool = True  # standardise features with the training rows' mean and std

    # >>> multilabel
    def checks(self):
        rule = "one or more characters, not blank (quote YAML's marks: data.label_sep='|')"
        return [("label_sep", bool(self.label_sep.strip()), rule)]
    # <<< multilabel


class CSVTable(InMemoryDataset):
    Options = Options
    test_option = "test_path"  # the option evaluate.py --data sets (data.build_test_set)

    @staticmethod
    def has_val_split(opts: Options) -> bool:
        return bool(opts.val_path)

    @staticmethod
    def has_test_split(opts: Options) -> bool:
        return bool(opts.test_path)

    def __init__(self, opts: Options, split: str):
        # >>> multilabel
        if not isinstance(opts.label, str) and opts.targets != "labels":
            raise ConfigError(
                f"data.label is a list of columns {opts.label[:5]}, which only multi-label "
                "targets read (task.name=multilabel); give one column for this task"
            )
        # <<< multilabel
        self.opts = opts
        key = {"val": "data.val_path", "test": "data.test_path"}.get(split, "data.path")
        self.path = path = Path(getattr(opts, key.removeprefix("data.")))
        self.key = key
        self.features, self.x, labels = read_table(path, key, opts)
        self.num_classes = self.num_targets = self.num_labels = None
        self.test_labels = self.label_names = None
        # >>> multilabel
        if opts.targets == "labels":
            names = None  # the training table's, or (test split) the model's in prepare
            if split == "val":
                names = label_names(read_table(Path(opts.path), "data.path", opts)[2], opts)
            self.classes, self.test_labels = None, labels
            if split != "test":
                self._set_labels(names or label_names(labels, opts))
        elif opts.targets == "value":
        # <<< multilabel
        if opts.targets == "value":  # feature: !multilabel
            self.y = _numbers(labels, path, opts.label).unsqueeze(1)  # (N, 1) targets
            self.num_targets = 1
            self.classes = None
        elif split == "test":  # class ids follow the model's class names (prepare)
            self.test_labels, self.classes, self.y = labels, None, None
        else:
            # Class ids follow the training table's sorted names, so train and val agree.
            train_labels = (
                labels if split != "val" else read_table(Path(opts.path), "data.path", opts)[2]
            )
            self.classes = sorted_names(train_labels)
            self.y = _class_ids(labels, self.classes, path, opts.label)
            self.num_classes = len(self.classes)
        self.meta = {"features": self.features, "label": opts.label, "classes": self.classes}
        # >>> multilabel
        if opts.targets == "labels":  # what predict.py needs to read a table's labels
            self.meta |= {"labels": self.label_names, "label_sep": opts.label_sep}

    def _set_labels(self, names: list[str]) -> None:
        """Multi-label targets (N, L) float 0/1 in the order of `names`."""
        self.label_names, self.num_labels = names, len(names)
        self.y = label_matrix(self.test_labels, names, self.path, self.opts)
        if hasattr(self, "meta"):
            self.meta = {**self.meta, "labels": names}
        # <<< multilabel

    def match_columns(self, names: list[str], source: str) -> None:
        """Take the feature columns in the order of `names`, the feature names of `source`
        (a checkpoint, or the training table): a table whose columns are in another order
        reads as that model reads it. A column missing, renamed or added is refused, naming
        the first that differs (taken by position, it would have fed the model another
        feature without a word)."""
        if names == self.features:
            return
        at, wanted = {name: i for i, name in enumerate(self.features)}, set(names)
        missing = next((name for name in names if name not in at), None)
        extra = next((name for name in self.features if name not in wanted), None)
        if missing is not None or extra is not None:
            if missing is None:
                problem = f"the feature column {extra!r}, which {source} does not have"
            else:
                instead = f" (it has {extra!r} instead)" if extra is not None else ""
                problem = f"no column {missing!r}, a feature of {source}{instead}"
            raise ConfigError(
                f"CSV file {str(self.path)!r} ({self.key}) has {problem}; give it the "
                f"feature columns of {source} (in any order: they are matched by name; "
                "data.features selects columns)"
            )
        self.x = self.x[:, [at[name] for name in names]]
        self.features = list(names)
        self.meta = {**self.meta, "features": self.features}

    def prepare(self, indices, meta: dict | None) -> dict:
        """Standardise with the statistics of the training rows `indices` (or `meta`'s, whose
        feature columns match_columns has matched)."""
        # >>> multilabel
        if meta is not None and self.opts.targets == "labels":
            if self.label_names is None:  # the test split: the model's labels
                self._set_labels(list(meta.get("labels") or []))
            if meta.get("labels") != self.label_names:
                raise ConfigError(
                    f"CSV file {str(self.path)!r} ({self.key}) has other labels than the model "
                    f"was trained on ({_listed(self.label_names)} now, "
                    f"{_listed(meta.get('labels') or [])} then); give it the same labels"
                )
        elif meta is not None and self.test_labels is not None:
        # <<< multilabel
        if meta is not None and self.test_labels is not None:  # feature: !multilabel
            self.classes = meta.get("classes") or []
            self.y = _class_ids(self.test_labels, self.classes, self.path, self.opts.label)
            self.num_classes, self.meta = len(self.classes), {**self.meta, "classes": self.classes}
        if meta is not None:
            if meta.get("classes") != self.classes:
                raise ConfigError(
                    f"CSV file {str(self.path)!r} ({self.key}) has other classes than the "
                    f"model was trained on ({_listed(self.classes or [])} now, "
                    f"{_listed(meta.get('classes') or [])} then); give it the same classes"
                )
            mean, std = torch.tensor(meta["mean"]), torch.tensor(meta["std"])
        elif self.opts.normalize:
            # As float32, as prediction reads them back from the meta: both scale alike.
            mean, std = (t.float() for t in mean_and_std(self.x[torch.as_tensor(list(indices))]))
        else:
            mean, std = torch.zeros(self.x.shape[1]), torch.ones(self.x.shape[1])
        self.x = (self.x - mean) / std
        self.meta = {**self.meta, "mean": mean.tolist(), "std": std.tolist()}
        return self.meta


def read_table(path: Path, key: str, opts: Options) -> tuple[list[str], torch.Tensor, list[str]]:
    """(feature names, features (N, F) float32, label strings) of a CSV file."""
    rows = _rows(path, key)
    header = [name.strip() for name in rows[0]]
    # A repeated name would read the first column's data twice and drop the second's.
    twice = next((name for name, n in Counter(header).items() if n > 1), None)
    if twice is not None:
        raise ConfigError(
            f"CSV file {str(path)!r} has the column {twice[:40]!r} twice; rename or drop one"
        )
    # Column positions by name: one dict, so a table of 100,000 columns reads in linear time.
    position = {name: i for i, name in enumerate(header)}
    targets = [opts.label] if isinstance(opts.label, str) else list(opts.label)
    absent = next((c for c in targets if c not in position), None)
    if absent is not None:
        raise ConfigError(
            f"CSV file {str(path)!r} has no column {absent!r} (columns: "
            f"{_listed(header)}); set data.label to the target column"
        )
    wanted = [c.strip() for c in opts.features.split(",") if c.strip()] or [
        c for c in header if c not in targets
    ]
    missing = [c for c in wanted if c not in position]
    if missing or not wanted or any(c in wanted for c in targets):
        problem = (
            f"no column {missing[0]!r}" if missing else "no feature columns besides the label"
        )
        raise ConfigError(f"CSV file {str(path)!r} has {problem}; check data.features")
    columns = [position[c] for c in wanted]
    label_at = [position[c] for c in targets]
    values, labels = [], []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ConfigError(
                f"CSV file {str(path)!r} line {line} has {len(row)} fields, the header "
                f"{len(header)}; fix that row"
            )
        try:
            values.append([float(row[i]) for i in columns])
        except ValueError:
            bad = next(i for i in columns if not is_number(row[i]))
            raise ConfigError(
                f"CSV file {str(path)!r} line {line}: column {header[bad]!r} holds "
                f"{row[bad]!r}, not a number; fill or drop that value, or leave the column out "
                "of data.features"
            ) from None
        found = [row[i].strip() for i in label_at]
        labels.append(found[0] if isinstance(opts.label, str) else found)
    x = torch.tensor(values, dtype=torch.float32)
    if not torch.isfinite(x).all():
        line = int((~torch.isfinite(x)).any(1).nonzero()[0]) + 2
        raise ConfigError(f"CSV file {str(path)!r} line {line} holds inf or nan; fix that row")
    return wanted, x, labels


def _rows(path: Path, key: str) -> list[list[str]]:
    """The CSV file's non-blank rows: a header and at least one data row."""
    if not path.is_file():
        raise ConfigError(f"CSV file {str(path)!r} not found; set {key} to your table")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError:
        raise ConfigError(f"CSV file {str(path)!r} is not UTF-8 text; save it as UTF-8") from None
    except csv.Error as exc:
        raise ConfigError(f"CSV file {str(path)!r} cannot be read: {exc}") from None
    rows = [row for row in rows if row]  # blank lines
    if len(rows) < 2:
        raise ConfigError(f"CSV file {str(path)!r} needs a header row and at least one data row")
    return rows


def _listed(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names):,} in all)"


def _class_ids(labels: list[str], classes: list[str], path: Path, column: str) -> torch.Tensor:
    index = {name: i for i, name in enumerate(classes)}
    unknown = next((name for name in labels if name not in index), None)
    if unknown is not None:
        raise ConfigError(
            f"CSV file {str(path)!r}: column {column!r} holds class {unknown!r}, which the "
            "training table does not have"
        )
    if len(classes) < 2:
        raise ConfigError(
            f"CSV file {str(path)!r}: column {column!r} holds one class only; a classifier "
            "needs two or more (or use task.name=regression)"
        )
    return torch.tensor([index[name] for name in labels], dtype=torch.int64)


def _numbers(labels: list[str], path: Path, column: str) -> torch.Tensor:
    try:
        return torch.tensor([float(v) for v in labels], dtype=torch.float32)
    except ValueError:
        bad = next(v for v in labels if not is_number(v))
        raise ConfigError(
            f"CSV file {str(path)!r}: column {column!r} holds {bad!r}, not a number, and "
            "regression needs numeric targets (or use task.name=classification)"
        ) from None
