"""Language modelling: next-token cross-entropy on logits (N, T, V) against tokens (N, T);
perplexity (exp of the mean loss per token) and next-token accuracy."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError


@dataclass
class Options:
    pass


class LanguageModel:
    Options = Options
    targets = "tokens"
    metrics = {"perplexity": "min", "loss": "min", "acc": "max"}

    def __init__(self, opts: Options, data):
        self.num_outputs = getattr(data, "vocab_size", None)
        if not self.num_outputs:
            raise ConfigError(
                "task.name=language_model needs token data with a vocab_size; use "
                "data.name=text or a dataset of token ids"
            )

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, -2), y.flatten())

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, y = output.float().flatten(0, -2), y.flatten()
        loss = F.cross_entropy(logits, y, reduction="sum")
        correct = (logits.argmax(-1) == y).sum().float()
        return torch.stack([loss, correct, torch.tensor(float(y.numel()), device=y.device)])

    def summarise(self, sums: list[float]) -> dict:
        loss, correct, tokens = sums
        mean = loss / tokens
        return {
            "perplexity": math.exp(min(mean, 700.0)),  # exp overflows past ~709
            "loss": mean,
            "acc": correct / tokens,
            "count": int(tokens),
        }
