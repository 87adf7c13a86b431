"""A sampler that shards across ranks and can start mid-epoch, for exact resume.

It draws the same permutation as torch's DistributedSampler (a generator seeded with
seed + epoch) but adds `start`: the number of samples of the epoch's global order already
consumed. Rank r of W ranks reads positions r, r+W, r+2W, ..., so after k batches of size B
the ranks together have consumed exactly the first k*B*W positions; skipping those resumes the
epoch on any number of ranks.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class ShardedSampler(Sampler[int]):
    def __init__(
        self,
        size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        even: bool = True,
    ):
        """`even`: every rank gets the same count (pads by wrapping around; for training, where
        ranks must step together). Without it shards differ by at most one and no sample
        repeats (for evaluation, where a repeat would be counted twice)."""
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.even = shuffle, seed, even
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _global_order(self) -> torch.Tensor:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g)
        else:
            order = torch.arange(self.size)
        if self.even:
            padded = -(-self.size // self.world_size) * self.world_size
            order = torch.cat([order, order[: padded - self.size]])
            order = order[self.start :]
            return order[: len(order) // self.world_size * self.world_size]
        return order[self.start :]

    def __iter__(self):
        return iter(self._global_order()[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, len(self._global_order()), self.world_size))
