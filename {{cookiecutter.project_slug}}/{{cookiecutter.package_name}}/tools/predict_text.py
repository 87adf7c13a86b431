"""predict.py's text: the readers of a text classifier's inputs (data.name=text_table), a CSV
with the training text column (its label column optional) or .txt files (one text each),
tokenised with the tokenizer the checkpoint carries and padded to the longest; and a language
model's generation (--prompt), a prompt of characters of its vocabulary continued."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..data.text_table import Options, pad, read_texts, tokenize
from ..errors import ConfigError
from ..utils.device import autocast
from .inference import Trained, device_option, inference_amp, load_trained


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


def check_sampling(temperature: float = 1.0, top_k: int = 0) -> None:
    """Refuse sampling options that cannot run, as the config refuses its values."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 picks the likeliest), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0 (0 samples among all), got {top_k}")


def generate(
    checkpoint: str,
    prompt: str,
    tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    device: str = "auto",
    amp: str | None = None,
) -> str:
    """The prompt continued by `tokens` tokens of the checkpoint's language model, under
    `amp` (None: the checkpoint's train.amp)."""
    if tokens < 0:
        raise ConfigError(f"--tokens must be >= 0, got {tokens}")
    check_sampling(temperature, top_k)
    target = device_option(device)
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
        what = f"the character {unknown!r}, which the model's vocabulary lacks" if prompt else ""
        raise ConfigError(
            f"--prompt holds {what or 'nothing'}; use characters of its training text "
            f"({''.join(vocab)[:60]!r})"
        )
    idx = torch.tensor([[index[c] for c in prompt]], device=target)
    with autocast(target, inference_amp(trained, target, amp)):
        out = trained.model.to(target).generate(idx, tokens, temperature=temperature, top_k=top_k)
    return "".join(vocab[i] for i in out[0].tolist())
