"""A sampler that shards across ranks and can start mid-epoch, for exact resume.

It draws a permutation as torch's DistributedSampler does, from a generator seeded with a hash
of (seed, epoch) rather than seed + epoch (which would give seed 43 the orders of seed 42 one
epoch later; see utils/seed.mix_seed), and adds `start`: the number of samples of the epoch's
global order already consumed. Rank r of W ranks reads positions r, r+W, r+2W, ..., so after
k batches of size B the ranks together have consumed exactly the first k*B*W positions;
skipping those resumes the epoch on any number of ranks.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler

from ..utils.seed import mix_seed


class ShardedSampler(Sampler[int]):
    def __init__(
        self,
        size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        even: bool = True,
        seeded: bool = False,
    ):
        """`even`: every rank gets the same count (pads by wrapping around; for training, where
        ranks must step together). Without it shards differ by at most one and no sample
        repeats (for evaluation, where a repeat would be counted twice).

        `seeded`: yield `(index, seed)` pairs, the seed a function of (seed, epoch, index)
        only, for datasets whose random augmentation draws from it: a sample is augmented the
        same way whichever worker, rank or resumed run reads it, so resume stays exact."""
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.even, self.seeded = shuffle, seed, even, seeded
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _global_order(self) -> torch.Tensor:
        if self.shuffle:
            g = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
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
        indices = self._global_order()[self.rank :: self.world_size].tolist()
        if not self.seeded:
            return iter(indices)
        return iter((i, mix_seed(self.seed, self.epoch, i)) for i in indices)

    def __len__(self) -> int:
        return len(range(self.rank, len(self._global_order()), self.world_size))
