"""A sampler that shards across ranks and can start mid-epoch, for exact resume.

It draws a permutation as torch's DistributedSampler does, from a generator seeded with a hash
of (seed, epoch) rather than seed + epoch (which would give seed 43 the orders of seed 42 one
epoch later; see utils/seed.mix_seed), and adds `start`: the number of samples of the epoch's
global order already consumed. Rank r of W ranks reads positions r, r+W, r+2W, ..., so after
k batches of size B the ranks together have consumed exactly the first k*B*W positions;
skipping those resumes the epoch on any number of ranks.

`labels` (data.sampler=balanced, class targets): the epoch's global order is instead `size`
draws with replacement, each a class chosen with equal probability and then one of its samples,
from the same (seed, epoch) generator: rare classes are seen as often as common ones, the
epoch keeps its length, and sharding, `start` and resume work on the draw as on a permutation.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, Sampler, Subset

from ..errors import ConfigError
from ..utils.seed import mix_seed
from .folds import class_labels


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
        labels: torch.Tensor | None = None,
    ):
        """`even`: every rank gets the same count (pads by wrapping around; for training, where
        ranks must step together). Without it shards differ by at most one and no sample
        repeats (for evaluation, where a repeat would be counted twice).

        `seeded`: yield `(index, seed)` pairs, the seed a function of (seed, epoch, index)
        only, for datasets whose random augmentation draws from it: a sample is augmented the
        same way whichever worker, rank or resumed run reads it, so resume stays exact.

        `labels`: the class id of each of the `size` samples, (size,) int64: draw balanced
        (see the module docstring) instead of shuffling."""
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.even, self.seeded = shuffle, seed, even, seeded
        self.epoch, self.start = 0, 0
        self.labels = labels
        if labels is not None:
            # Samples grouped by class (stable: ascending indices within each class).
            self.by_class = torch.sort(labels, stable=True).indices
            self.counts = torch.bincount(labels)
            self.starts = torch.cumsum(self.counts, 0) - self.counts
            self.present = self.counts.nonzero().squeeze(1)  # a class without samples: never

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _balanced_draw(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
        cls = self.present[torch.randint(len(self.present), (self.size,), generator=g)]
        within = torch.rand(self.size, generator=g, dtype=torch.float64) * self.counts[cls]
        within = torch.minimum(within.long(), self.counts[cls] - 1)
        return self.by_class[self.starts[cls] + within]

    def _global_order(self) -> torch.Tensor:
        if self.labels is not None:
            order = self._balanced_draw()
        elif self.shuffle:
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
        order = self._global_order()
        indices = order[self.rank :: self.world_size].tolist()
        if not self.seeded:
            return iter(indices)
        if self.labels is None:
            return iter((i, mix_seed(self.seed, self.epoch, i)) for i in indices)
        # A balanced draw repeats samples: each draw gets its own augmentation, seeded by its
        # position in the epoch's global order too (the same on any rank or resumed run).
        first, end = self.start + self.rank, self.start + len(order)
        positions = range(first, end, self.world_size)
        return iter(
            (i, mix_seed(self.seed, self.epoch, i, p))
            for i, p in zip(indices, positions, strict=True)
        )

    def __len__(self) -> int:
        return len(range(self.rank, len(self._global_order()), self.world_size))


def train_labels(dataset: Dataset) -> torch.Tensor:
    """The class id of each sample of `dataset` (a Split of a pool, or a dataset of its own),
    for data.sampler=balanced: the pool's `y` where it holds one, else one pass over it."""
    source, rows = dataset, None
    if isinstance(dataset, Subset):  # a Split of one pool (data/__init__.py)
        source, rows = dataset.dataset, torch.as_tensor(list(dataset.indices), dtype=torch.int64)
    y = class_labels(source)
    if y is None:
        y = torch.stack([torch.as_tensor(source[i][1]) for i in range(len(source))])
    labels = y if rows is None else y[rows]
    if labels.dim() != 1 or labels.is_floating_point():
        raise ConfigError(
            "data.sampler=balanced draws by class and needs one class id per sample; use "
            "data.sampler=shuffle for these targets"
        )
    return labels.long()
