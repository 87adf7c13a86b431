"""Character-level text: one UTF-8 file cut into windows of `seq_len` next-character pairs.

    data:
      name: text
      path: data/demo/text.txt     # python scripts/make_demo_data.py text writes this one
      seq_len: 64
    model:
      name: transformer
    task:
      name: language_model

The vocabulary is the sorted set of the file's characters; it travels in every checkpoint
(`meta["vocab"]`), so prediction encodes prompts and decodes tokens the same way. The text is
cut into consecutive chunks of seq_len + 1 characters, one window each: x = chunk[:-1],
y = chunk[1:]. Chunks do not overlap, so an epoch reads the text once (stride-1 windows would
make an epoch seq_len times longer, of near-duplicates), and every character sits in exactly
one window. Validation is the last data.val_fraction of the windows, a contiguous tail of the
text: no validation character is ever trained on, and no window straddles the cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .in_memory import InMemoryDataset


@dataclass
class Options:
    path: str = "data/demo/text.txt"  # a UTF-8 text file; its tail validates
    seq_len: int = 64  # characters per window: the context the model learns from
    # A held-out test text (its characters the training text's): never trained on nor used
    # to choose best.pt; scored at the end of training and by evaluate.py --split test
    test_path: str = ""

    def checks(self):
        return [("seq_len", self.seq_len >= 1, ">= 1")]


class TextChars(InMemoryDataset):
    Options = Options

    test_option = "test_path"  # the option evaluate.py --data sets (data.build_test_set)

    @staticmethod
    def has_val_split(opts: Options) -> bool:
        return False  # one file: build_datasets calls holdout() for the validation tail

    @staticmethod
    def has_test_split(opts: Options) -> bool:
        return bool(opts.test_path)

    def __init__(self, opts: Options, split: str):
        self.path = opts.test_path if split == "test" else opts.path
        self.split = split
        text = read_text(Path(self.path))
        self.text = text if split == "test" else None  # re-encoded in prepare
        t = opts.seq_len
        n = len(text) // (t + 1)
        if n < 1:
            raise ConfigError(
                f"text file {opts.path!r} holds {len(text)} characters, too few for one window "
                f"of data.seq_len + 1 = {t + 1}; use a longer text or a smaller data.seq_len"
            )
        self.vocab, ids = encode(text)
        chunks = ids[: n * (t + 1)].view(n, t + 1)  # (N, T + 1)
        # Views of one buffer, not copies: batches gather from them (InMemoryDataset).
        self.x, self.y = chunks[:, :-1], chunks[:, 1:]  # (N, T) each, y shifted by one
        self.vocab_size = len(self.vocab)
        self.meta = {"vocab": self.vocab, "seq_len": t}

    def holdout(self, fraction: float) -> tuple[list[int], list[int]]:
        """(train, val) window indices: the last `fraction` of the windows validates."""
        n = len(self)
        cut = n - max(1, round(fraction * n))
        return list(range(cut)), list(range(cut, n))

    def prepare(self, indices, meta: dict | None) -> dict:
        if meta is not None and self.split == "test":  # encoded with the model's vocabulary
            self._encode_as(meta.get("vocab") or "")
        # A checkpoint's vocabulary must be this file's: other ids would mean other characters.
        if meta is not None and meta.get("vocab") != self.vocab:
            raise ConfigError(
                f"text file {self.path!r} has another character set than the training run's "
                f"({len(self.vocab)} characters now, {len(meta.get('vocab') or '')} then); "
                "evaluate on the same text"
            )
        return self.meta

    def _encode_as(self, vocab: str) -> None:
        known = set(vocab)
        unknown = next((c for c in dict.fromkeys(self.text) if c not in known), None)
        if unknown is not None:
            raise ConfigError(
                f"text file {self.path!r} holds the character {unknown!r}, which the training "
                "text does not have; a test text may use only the training text's characters"
            )
        codes = torch.tensor([ord(c) for c in vocab], dtype=torch.int64)
        t = self.x.shape[1]
        text_codes = torch.frombuffer(bytearray(self.text.encode("utf-32-le")), dtype=torch.int32)
        ids = torch.searchsorted(codes, text_codes.long())
        chunks = ids[: len(self.x) * (t + 1)].view(len(self.x), t + 1)
        self.x, self.y = chunks[:, :-1], chunks[:, 1:]
        self.vocab, self.vocab_size = vocab, len(vocab)
        self.meta = {**self.meta, "vocab": vocab}


def read_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(
            f"text file {str(path)!r} not found; set data.path to a UTF-8 text file (python "
            "scripts/make_demo_data.py text writes the demo)"
        )
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")  # a byte-order mark is not part of the text
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"text file {str(path)!r} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None


def encode(text: str) -> tuple[str, torch.Tensor]:
    """(vocabulary, ids): the sorted distinct characters, and each character's index in them
    as int64 (L,). Vectorised over code points: a few MB of text take milliseconds."""
    codes = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
    vocab_codes = codes.unique()  # sorted: the same order as sorted(set(text))
    ids = torch.searchsorted(vocab_codes, codes)  # (L,) int64
    return "".join(map(chr, vocab_codes.tolist())), ids
