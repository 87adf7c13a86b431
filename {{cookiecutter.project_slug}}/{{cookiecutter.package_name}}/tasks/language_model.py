"""Language modelling: next-token cross-entropy on logits (N, T, V) against tokens (N, T);
perplexity (exp of the mean loss per token) and next-token accuracy."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..utils.device import sums_dtype


@dataclass
class Options:
    pass


class LanguageModel:
    Options = Options
    targets = "tokens"
    metrics = {"perplexity": "min", "loss": "min", "acc": "max"}

    def __init__(self, opts: Options, data, meta: dict | None = None):
        self.num_outputs = getattr(data, "vocab_size", None)
        if not self.num_outputs:
            raise ConfigError(
                "task.name=language_model needs token data with a vocab_size; use "
                "data.name=text or a dataset of token ids"  # feature: text
                "data.name=tensors with int64 x and y of the same shape (token ids)"  # feature: !text
            )

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, -2), y.flatten())

    def decode(self, output: torch.Tensor) -> torch.Tensor:
        return output  # logits

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        logits, y = output.float().flatten(0, -2), y.flatten()
        wide = sums_dtype(y.device)
        return {
            "loss": F.cross_entropy(logits, y, reduction="sum").to(wide),
            "correct": (logits.argmax(-1) == y).sum().to(wide),
            "tokens": torch.full((), y.numel(), dtype=wide, device=y.device),
        }

    def summarise(self, sums: dict) -> dict:
        tokens = sums["tokens"]
        mean = sums["loss"] / tokens
        return {
            "perplexity": math.exp(min(mean, 700.0)),  # exp overflows past ~709
            "loss": mean,
            "acc": sums["correct"] / tokens,
            "count": int(tokens),
        }

    # >>> export
    # What an exported artifact computes (logits: no head) and promises.
    def head(self) -> None:
        return None

    def describe(self) -> dict:
        return {
            "shape": ["batch", "positions", self.num_outputs],
            "units": "next-token logits per position over `vocab`",
        }
    # <<< export
