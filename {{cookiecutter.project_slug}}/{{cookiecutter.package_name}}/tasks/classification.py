"""Classification: cross-entropy (optionally label-smoothed) on logits (N, K); accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError


@dataclass
class Options:
    label_smoothing: float = 0.0  # spreads this much target mass over all classes (0 = off)

    def checks(self):
        return [("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)")]


class Classification:
    Options = Options
    targets = "class"
    metrics = {"acc": "max", "loss": "min"}

    def __init__(self, opts: Options, data):
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

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # The reported loss is the plain cross-entropy, comparable across label_smoothing.
        loss = F.cross_entropy(output.float(), y, reduction="sum")
        correct = (output.argmax(1) == y).sum()
        return torch.stack([loss, correct.float(), torch.tensor(float(len(y)), device=y.device)])

    def summarise(self, sums: list[float]) -> dict:
        loss, correct, count = sums
        return {"loss": loss / count, "acc": correct / count, "count": int(count)}
