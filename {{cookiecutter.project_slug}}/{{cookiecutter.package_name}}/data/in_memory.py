"""Base for datasets held in memory as two tensors: inputs `x` (N, ...) and labels `y` (N,)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class InMemoryDataset(Dataset):
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        # The DataLoader calls this with a whole batch of indices: one gather instead of
        # batch_size __getitem__ calls and a collate.
        idx = torch.as_tensor(indices)
        return self.x[idx], self.y[idx]
