"""Base for datasets held in memory as two tensors: inputs `x` (N, ...), targets `y` (N, ...);
and the statistics that standardise their columns."""

from __future__ import annotations

from array import array

import torch
from torch.utils.data import Dataset


class InMemoryDataset(Dataset):
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int | list[int]):
        # An int gives one sample; a list of indices (build_loader's batch sampler) gives the
        # whole batch in one gather instead of batch_size calls and a collate.
        if isinstance(i, list):
            # Through a buffer: torch.as_tensor(list) parses each int (~30 us a batch of 64).
            i = torch.frombuffer(array("q", i), dtype=torch.int64) if i else torch.as_tensor(i)
        return self.x[i], self.y[i]


def mean_and_std(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and standard deviation of `rows` (N, F), in float64, for standardising.
    A constant column gets std 1, not ~0: dividing by ~0 would blow a new value in it (at
    prediction) up by 1e8 or more, where it should stay a moderate number."""
    rows = rows.double()
    mean, std = rows.mean(0), rows.std(0, correction=0)
    constant = std <= 1e-12 * mean.abs()  # zero, up to float64 rounding of the mean
    return mean, torch.where(constant, torch.ones_like(std), std)
