"""Dataset registry and loader factory.

To add a dataset: write data/<name>.py with a torch Dataset whose constructor takes
(cfg: DataConfig, split: "train" | "val") and which sets `input_shape` (C, H, W) and
`num_classes`; then add one line to DATASETS. Data that fits in memory as two tensors can
subclass InMemoryDataset (set `self.x`, `self.y`) and is batched by indexing, without
per-sample collation. With `data.folds=K`, both splits are folds of the training split
(data/folds.py).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from ..config import DataConfig, closest
from ..errors import ConfigError
from ..utils.seed import seed_worker
from ..utils.signals import ignore_stop_signals
from .folds import fold_split
from .sampler import ShardedSampler
from .synthetic import SyntheticGratings
from .tensor_files import TensorFiles

DATASETS = {
    "synthetic": SyntheticGratings,
    "tensors": TensorFiles,
}


def build_dataset(cfg: DataConfig, split: str) -> Dataset:
    if cfg.name not in DATASETS:
        close = closest(cfg.name, DATASETS)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(
            f"data.name={cfg.name!r} is not a dataset; choose from {', '.join(DATASETS)}{hint}"
        )
    if cfg.folds >= 2:  # k-fold: train and val are both drawn from the training split
        return fold_split(DATASETS[cfg.name](cfg, "train"), cfg, split)
    return DATASETS[cfg.name](cfg, split)


def build_loader(
    dataset: Dataset,
    cfg: DataConfig,
    batch_size: int,
    train: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> DataLoader:
    """Training loaders shuffle per epoch and drop the ragged last batch so every rank steps
    the same number of times; evaluation loaders keep every sample exactly once."""
    sampler = ShardedSampler(len(dataset), rank, world_size, shuffle=train, seed=seed, even=train)
    workers = cfg.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=workers,
        collate_fn=_already_batched if hasattr(dataset, "__getitems__") else None,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,  # keep workers (and their warm caches) across epochs
        worker_init_fn=_init_worker,
        # A private generator: worker seeds come from (seed, rank), not the global RNG stream.
        generator=torch.Generator().manual_seed(seed + 1000 * rank),
    )


def _init_worker(worker_id: int) -> None:
    seed_worker(worker_id)
    ignore_stop_signals()  # the training process saves on SIGTERM; workers must outlive it


def _already_batched(batch):
    return batch
