"""Regression: MSE or Huber loss on outputs (N, T) against targets (N, T) or (N,); MAE, RMSE, R².

The model learns standardised targets, (y - mean) / std with the training rows' statistics
from the data meta (`task.standardize_targets`), so targets in any units (prices, years,
kelvins) train at the usual learning rates; the loss is in those standardised units.
`decode` maps outputs back, and rmse, mae and R² are in the targets' own units. R² is
1 - SSE / SST with SST summed over the targets (variance-weighted for several), from float64
sums of targets shifted by their training mean, which would otherwise cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn  # feature: export

from ..errors import ConfigError
from ..utils.device import sums_dtype


@dataclass
class Options:
    loss: Literal["mse", "huber"] = "mse"  # huber: less pulled by outliers
    huber_delta: float = 1.0  # huber: where the loss turns from quadratic to linear
    standardize_targets: bool = True  # learn (y - mean) / std of the training targets

    def checks(self):
        return [("huber_delta", self.huber_delta > 0, "> 0")]


class Regression:
    Options = Options
    targets = "value"
    metrics = {"rmse": "min", "mae": "min", "r2": "max", "loss": "min"}

    def __init__(self, opts: Options, data, meta: dict | None = None):
        self.opts, self.meta = opts, meta or {}
        self.num_outputs = getattr(data, "num_targets", None)
        if not self.num_outputs:
            raise ConfigError(
                "task.name=regression needs numeric targets, but the dataset has no "
                "num_targets; choose a dataset with value targets (e.g. data.name=csv)"
            )
        # Checkpoints from before target statistics have none: their models learnt raw targets.
        meta, k = meta or {}, self.num_outputs
        mean = torch.tensor(meta.get("target_mean", [0.0] * k), dtype=torch.float64)
        std = torch.tensor(meta.get("target_std", [1.0] * k), dtype=torch.float64)
        self.shift = mean  # for SST: a constant that every rank knows
        if not opts.standardize_targets:
            mean, std = torch.zeros_like(mean), torch.ones_like(std)
        self.mean, self.std = mean, std
        self._copies = {}

    def _stats(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(mean, std, shift) on `device`, copied once: a copy per batch would wait for the GPU."""
        key = (device, dtype)
        if key not in self._copies:
            self._copies[key] = tuple(
                t.to(device, dtype) for t in (self.mean, self.std, self.shift)
            )
        return self._copies[key]

    def loss(self, output: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        output = output.view_as(y)  # (N, 1) outputs for (N,) targets
        mean, std, _ = self._stats(y.device, y.dtype)
        y = (y - mean) / std  # mean, std (T,): broadcast over the rows of (N, T) or (N,)
        if self.opts.loss == "huber":
            return F.huber_loss(output, y, reduction=reduction, delta=self.opts.huber_delta)
        return F.mse_loss(output, y, reduction=reduction)

    def decode(self, output: torch.Tensor) -> torch.Tensor:
        """Outputs (N, T) in the targets' units, in float64 (float32 on MPS)."""
        mean, std, _ = self._stats(output.device, sums_dtype(output.device))
        return output.to(mean.dtype).view(len(output), self.num_outputs) * std + mean

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        n, wide = len(y), sums_dtype(y.device)
        output, y = output.float().view(n, self.num_outputs), y.float().view(n, self.num_outputs)
        err = self.decode(output) - y.to(wide)
        shifted = y.to(wide) - self._stats(y.device, wide)[2]
        return {
            "loss": self.loss(output, y, "sum").to(wide),  # in standardised units
            "sse": err.square().sum(),
            "sae": err.abs().sum(),
            "elements": torch.full((), err.numel(), dtype=wide, device=y.device),
            "count": torch.full((), n, dtype=wide, device=y.device),
            "y_sum": shifted.sum(0),  # per target: sum and sum of squares, for SST
            "y_sq": shifted.square().sum(0),
        }

    def summarise(self, sums: dict) -> dict:
        elements, count, sse = sums["elements"], sums["count"], sums["sse"]
        sst = sum(sq - s * s / count for s, sq in zip(sums["y_sum"], sums["y_sq"], strict=True))
        return {
            "loss": sums["loss"] / elements,
            "rmse": (sse / elements) ** 0.5,
            "mae": sums["sae"] / elements,
            "r2": 1 - sse / sst if sst > 0 else float("nan"),
            "count": int(count),
        }

    # >>> export
    # What an exported artifact computes and promises (predict.py writes decode's values).
    def head(self) -> nn.Module:
        return Unstandardise(self.mean.float(), self.std.float())  # decode, in float32
    # <<< export

    def target_names(self) -> list[str]:
        label, k = self.meta.get("label"), self.num_outputs
        return [label] if isinstance(label, str) and k == 1 else [f"target_{i}" for i in range(k)]

    # >>> export
    def describe(self) -> dict:
        return {
            "shape": ["batch", self.num_outputs],
            "units": "values per target in the targets' own units (the un-standardisation is "
            "inside)",
            "targets": self.target_names(),
        }
    # <<< export


# >>> export
class Unstandardise(nn.Module):
    """decode inside an exported artifact: standardised outputs (N, T) to the targets' units."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std + self.mean  # (N, T) * (T,) + (T,)
# <<< export
