"""Base for datasets held in memory as two tensors: inputs `x` (N, ...), targets `y` (N, ...)."""

from __future__ import annotations

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
            i = torch.as_tensor(i)
        return self.x[i], self.y[i]
