"""Regression: MSE or Huber loss on outputs (N, T) against targets (N, T) or (N,); MAE, RMSE, R².

R² is 1 - SSE / SST with SST summed over the targets (variance-weighted for several).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ..errors import ConfigError


@dataclass
class Options:
    loss: Literal["mse", "huber"] = "mse"  # huber: less pulled by outliers
    huber_delta: float = 1.0  # huber: where the loss turns from quadratic to linear

    def checks(self):
        return [("huber_delta", self.huber_delta > 0, "> 0")]


class Regression:
    Options = Options
    targets = "value"
    metrics = {"rmse": "min", "mae": "min", "r2": "max", "loss": "min"}

    def __init__(self, opts: Options, data):
        self.opts = opts
        self.num_outputs = getattr(data, "num_targets", None)
        if not self.num_outputs:
            raise ConfigError(
                "task.name=regression needs numeric targets, but the dataset has no "
                "num_targets; choose a dataset with value targets (e.g. data.name=csv)"
            )

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        output = output.view_as(y)  # (N, 1) outputs for (N,) targets
        if self.opts.loss == "huber":
            return F.huber_loss(output, y, delta=self.opts.huber_delta)
        return F.mse_loss(output, y)

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        output, y = output.float().view(len(y), -1), y.float().view(len(y), -1)
        err = output - y
        loss = self.loss(output, y) * err.numel()
        return torch.cat(
            [
                torch.stack([loss, err.square().sum(), err.abs().sum()]),
                torch.tensor([float(err.numel()), float(len(y))], device=y.device),
                y.sum(0),  # per target: sum and sum of squares, for SST
                y.square().sum(0),
            ]
        )

    def summarise(self, sums: list[float]) -> dict:
        loss, sse, sae, elements, count = sums[:5]
        k = (len(sums) - 5) // 2
        y_sum, y_sq = sums[5 : 5 + k], sums[5 + k :]
        sst = sum(sq - s * s / count for s, sq in zip(y_sum, y_sq, strict=True))
        return {
            "loss": loss / elements,
            "rmse": (sse / elements) ** 0.5,
            "mae": sae / elements,
            "r2": 1 - sse / sst if sst > 0 else float("nan"),
            "count": int(count),
        }
