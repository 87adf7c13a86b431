"""Texts to classify: a CSV's text column and label column, or a folder of class folders of
.txt files, tokenised once by a Hugging Face tokenizer, padded per batch.

    data:
      name: text_table
      path: data/demo/reviews.csv    # or data/tickets/ holding <class>/*.txt
      text_column: text
      label: label
    model:
      name: hf                       # a sequence classifier (models/hf.py)
      arch: data/bert-tiny           # a hub id or a save_pretrained folder

The tokenizer is the model's (data.tokenizer=auto) or a folder holding tokenizer.json, and
must be a fast one (the `tokenizers` library). Every text is tokenised once when the data is
built, not per epoch; a batch is padded to its own longest text (dynamic padding), with the
tokenizer's pad id, which the model masks out. The tokenizer itself (its tokenizer.json), its
pad id and maximum length travel in every checkpoint (`meta`), so the tools that read it
(evaluation, prediction) tokenise new text exactly as training did, without the hub or the
folder.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..errors import ConfigError, first_line
from .in_memory import InMemoryDataset
from .targets import sorted_names

LONGEST = 512  # max_length=0 takes the tokenizer's limit, at most this (some say 10^30)


@dataclass
class Options:
    path: str = "data/demo/reviews.csv"  # a CSV file, or a folder of <class>/*.txt folders
    text_column: str = "text"  # the CSV's column of texts
    label: str = "label"  # the CSV's column of class names
    tokenizer: str = "auto"  # auto: model.name=hf's own; or a folder holding tokenizer.json
    max_length: int = 0  # tokens per text at most (longer ones are cut); 0 = the tokenizer's
    # A held-out test file or folder like `path`: never trained on nor used to choose best.pt
    test_path: str = ""

    def checks(self):
        return [("max_length", self.max_length >= 0, ">= 2, or 0 (the tokenizer's limit)")]


class TextTable(InMemoryDataset):
    Options = Options
    variable_length = True  # samples are token ids of their own length (models.model_io)
    test_option = "test_path"  # the option evaluate.py --data sets (data.build_test_set)

    @staticmethod
    def has_val_split(opts: Options) -> bool:
        return False  # data.val_fraction of the rows validates, stratified by class

    @staticmethod
    def has_test_split(opts: Options) -> bool:
        return bool(opts.test_path)

    @staticmethod
    def from_model(opts: Options, prep: dict) -> Options:
        """The model's tokenizer and its maximum length where the options say auto."""
        auto = {k: v for k, v in prep.items() if getattr(opts, k, None) in (0, "auto")}
        return replace(opts, **auto)

    def __init__(self, opts: Options, split: str):
        self.opts = opts
        self.path = Path(opts.test_path if split == "test" else opts.path)
        self.texts, labels = read_texts(self.path, opts)
        self.classes = sorted_names(labels)
        self.num_classes = len(self.classes)
        if self.num_classes < 2:
            raise ConfigError(
                f"text data {str(self.path)!r} has {self.num_classes} class; a classifier "
                f"needs at least 2 in its {opts.label!r} labels"
            )
        at = {name: i for i, name in enumerate(self.classes)}
        self.y = torch.tensor([at[label] for label in labels], dtype=torch.int64)
        self.meta = {"classes": self.classes}

    def prepare(self, indices, meta: dict | None) -> dict:
        """Tokenise every text once, with the checkpoint's tokenizer (`meta`) or the options'.
        Nothing is learnt from the texts."""
        if meta is not None:
            if meta.get("classes") != self.classes and self.classes:
                known = set(meta.get("classes") or ())
                extra = next((c for c in self.classes if c not in known), None)
                if extra is not None:
                    raise ConfigError(
                        f"text data {str(self.path)!r} has the class {extra!r}, which the "
                        f"training run did not have ({', '.join(known)}); score known classes"
                    )
                at = {name: i for i, name in enumerate(meta["classes"])}
                self.y = torch.tensor([at[self.classes[i]] for i in self.y.tolist()])
                self.classes = self.meta["classes"] = list(meta["classes"])
            spec = {k: meta[k] for k in ("tokenizer", "max_length", "pad_id")}
        else:
            spec = tokenizer_spec(self.opts.tokenizer, self.opts.max_length)
        self.meta = {"classes": self.classes, **spec}
        ids = tokenize(spec, self.texts)
        self.lengths = torch.tensor([len(t) for t in ids], dtype=torch.int64)
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.int64), self.lengths.cumsum(0)])
        self.ids = torch.tensor([i for t in ids for i in t], dtype=torch.int64)
        return self.meta

    def __getitem__(self, i: int | list[int]):
        # One text: its ids. A batch (a list of indices): padded to its longest text.
        if not isinstance(i, list):
            return self.ids[self.offsets[i] : self.offsets[i + 1]], self.y[i]
        rows = [self.ids[self.offsets[j] : self.offsets[j + 1]] for j in i]
        return pad(rows, self.meta["pad_id"]), self.y[i]


def read_texts(path: Path, opts: Options, labelled: bool = True) -> tuple[list[str], list | None]:
    """(texts, labels) of a CSV's two columns, or of a folder's <class>/*.txt files. Not
    `labelled` (new texts to predict): a CSV may lack the label column (labels None)."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*/*.txt") if not p.name.startswith("."))
        if not files:
            raise ConfigError(f"text folder {str(path)!r} holds no <class>/*.txt files")
        return [p.read_text(encoding="utf-8") for p in files], [p.parent.name for p in files]
    if not path.is_file():
        raise ConfigError(
            f"text data {str(path)!r} not found; set data.path to a CSV file with the columns "
            f"{opts.text_column!r} and {opts.label!r}, or a folder of <class>/*.txt"
        )
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0]) if rows else []
    has_labels = opts.label in header or labelled
    for column in (opts.text_column, opts.label)[: 1 + has_labels]:
        if column not in header:
            raise ConfigError(
                f"CSV file {str(path)!r} has no column {column!r} (it has "
                f"{', '.join(header)[:200] or 'no rows'}); set data.text_column and data.label"
            )
    texts = [(row[opts.text_column] or "").strip() for row in rows]
    empty = next((i for i, text in enumerate(texts) if not text), None)
    if empty is not None:
        raise ConfigError(
            f"CSV file {str(path)!r} line {empty + 2}: column {opts.text_column!r} is empty; "
            "fill or drop that row"
        )
    if not has_labels:
        return texts, None
    labels = [(row[opts.label] or "").strip() for row in rows]
    if "" in labels:
        raise ConfigError(
            f"CSV file {str(path)!r} line {labels.index('') + 2}: column {opts.label!r} is "
            "empty; label or drop that row"
        )
    return texts, labels


def tokenizer_spec(source: str, max_length: int) -> dict:
    """What the checkpoint keeps of a tokenizer: its whole tokenizer.json, pad id, max length."""
    if source == "auto":
        raise ConfigError(
            "data.tokenizer=auto takes the model's tokenizer, but model.name is not hf; set "
            "data.tokenizer to a folder holding tokenizer.json"
        )
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(source)
    except ImportError:
        raise ConfigError(
            "data.name=text_table needs transformers: pip install -e '.[hf]'"
        ) from None
    except (OSError, ValueError) as exc:
        if not Path(source).exists():  # a hub id: not cached, and no network
            raise ConfigError(
                f"tokenizer {source!r} could not be read ({first_line(exc, 100)}); without "
                "the network, set model.arch (or data.tokenizer) to a folder save_pretrained "
                "wrote, and HF_HUB_OFFLINE=1 to stop the hub's retries"
            ) from None
        raise ConfigError(
            f"tokenizer {source!r} cannot be read ({first_line(exc, 100)}); give a folder "
            "holding tokenizer.json (save_pretrained's)"
        ) from None
    if not tok.is_fast:
        raise ConfigError(f"tokenizer {source!r} has no fast (tokenizer.json) version")
    words = set(tok.get_vocab()) - set(tok.all_special_tokens)
    if not words:  # transformers builds one from a model's config alone: every word [UNK]
        raise ConfigError(
            f"tokenizer {source!r} holds only special tokens ({len(tok.get_vocab())}), so every "
            "word would read as unknown; give a folder holding the model's tokenizer files "
            "(tokenizer.json, from save_pretrained of the tokenizer too)"
        )
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ConfigError(f"tokenizer {source!r} has neither a pad nor an end token to pad with")
    limit = min(tok.model_max_length, LONGEST)
    if max_length > tok.model_max_length:  # positions the model has no embedding for
        raise ConfigError(
            f"data.max_length={max_length} is beyond what tokenizer {source!r} and its model "
            f"take ({tok.model_max_length}); lower it, or 0 for that limit"
        )
    return {
        "tokenizer": tok.backend_tokenizer.to_str(),
        "max_length": max_length or limit,
        "pad_id": pad,
    }


def pad(rows: list, pad_id: int) -> torch.Tensor:
    """Token ids of several texts as one (N, longest) int64 batch, padded with `pad_id`."""
    batch = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.int64)
    for row, ids in zip(batch, rows, strict=True):
        row[: len(ids)] = torch.as_tensor(ids)
    return batch


def tokenize(spec: dict, texts: list[str]) -> list[list[int]]:
    """Token ids of `texts`, special tokens added, cut at the spec's max_length."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(spec["tokenizer"])
    tok.no_padding()
    tok.enable_truncation(spec["max_length"])
    return [encoding.ids for encoding in tok.encode_batch(texts)]
