"""Classification: cross-entropy (optionally label-smoothed) on logits (N, K); accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..utils.device import sums_dtype


@dataclass
class Options:
    label_smoothing: float = 0.0  # spreads this much target mass over all classes (0 = off)

    def checks(self):
        return [("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)")]


class Classification:
    Options = Options
    targets = "class"
    metrics = {"acc": "max", "loss": "min"}

    def __init__(self, opts: Options, data, meta: dict | None = None):
        self.label_smoothing = opts.label_smoothing
        self.num_outputs = getattr(data, "num_classes", None)
        if not self.num_outputs:
            found = "values (floats)" if getattr(data, "num_targets", None) else "no class ids"
            raise ConfigError(
                f"task.name=classification needs class ids, but the dataset's targets are "
                f"{found}; use task.name=regression, or convert the labels to class ids "
                "(e.g. y.long())"
            )

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, y, label_smoothing=self.label_smoothing)

    def decode(self, output: torch.Tensor) -> torch.Tensor:
        return output  # logits

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        # The reported loss is the plain cross-entropy, comparable across label_smoothing.
        # Per batch in float32; the float64 sums add up over batches and ranks without loss.
        wide = sums_dtype(y.device)
        return {
            "loss": F.cross_entropy(output.float(), y, reduction="sum").to(wide),
            "correct": (output.argmax(1) == y).sum().to(wide),
            "count": torch.full((), len(y), dtype=wide, device=y.device),
        }

    def summarise(self, sums: dict) -> dict:
        count = sums["count"]
        return {"loss": sums["loss"] / count, "acc": sums["correct"] / count, "count": int(count)}
