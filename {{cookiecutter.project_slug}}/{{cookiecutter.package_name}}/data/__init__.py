"""Dataset registry, the validation split and the loader factory.

To add a dataset: write data/<name>.py with a torch Dataset, then add one line to DATASETS.
The class takes `(opts, split)`: its `Options` dataclass (its keys in the config's `data:`
section, beside `name`) and "train", "val", or "all" when it has one pool of samples
(`has_val_split(opts)` returns False; `data.val_fraction` of the pool is then held out,
stratified by class). `dataset[i]` is a pair `(x, y)` of tensors:
- x: float features of any shape, (F,) or (C, H, W), or int64 token ids (T,);
- y: an int64 class id ("class" targets; set `num_classes`), float values of shape () or
  (K,) ("value" targets; set `num_targets`), a float 0/1 vector (L,) ("labels" targets, any
  number of L labels per sample; set `num_labels` and `label_names`, or `num_targets`), or
  int64 tokens (T,) (set `vocab_size`).
Optional: `classes` (class names), `meta` (what prediction needs to read new inputs), and
`prepare(indices, meta)`, which learns preprocessing (e.g. normalisation) from the training
rows `indices`, or applies a checkpoint's `meta`, and returns the meta. The mean and std of
"value" targets over the training rows are added to the meta here, for every dataset.
Data held in memory as two tensors can subclass InMemoryDataset: batches are then one
gather (`dataset[list_of_indices]`), not `batch_size` calls and a collate.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Subset

from ..errors import ConfigError
from ..registry import Registry
from ..utils.device import check_batch_memory, check_workers
from ..utils.seed import mix_seed, seed_worker
from ..utils.signals import deferred_in_children, ignore_stop_signals
from .folds import assign_folds, class_labels, holdout
from .held_out import OTHER_ROWS, check_own_val
from .in_memory import InMemoryDataset
from .sampler import ShardedSampler, train_labels
from .targets import target_stats

# Tells the loaders' seeds (seed, rank, LOADER_STREAM) from the ranks' (seed, rank) and the
# samples' (seed, epoch, index): b"loader" as a number, beyond any epoch or index.
LOADER_STREAM = int.from_bytes(b"loader", "big")

DATASETS = Registry(
    __name__,
    synthetic=".synthetic:SyntheticGratings",
    tensors=".tensor_files:TensorFiles",
    csv=".csv_table:CSVTable",
    image_folder=".image_folder:ImageFolder",  # feature: images
    text=".text:TextChars",  # feature: text
    # >>> pretrained
    text_table=".text_table:TextTable",  # texts to classify, with a Hugging Face tokenizer  # feature: text
    # <<< pretrained
)


def build_datasets(cfg, targets: str, meta=None, like=None, prep: dict | None = None):
    """(train, val, meta) for cfg (the config's data section): the dataset's own splits, or a
    held-out part of its one pool, or k folds. `targets` ("class", "value", "labels",
    "tokens") is what the task needs; `meta` (from a checkpoint) makes evaluation use the
    training run's preprocessing and split. `like`: the meta of a checkpoint that a run
    resumes or fine-tunes, whose inputs these must match (`meta` where given; see
    match_inputs). `prep`: a pretrained model's preprocessing, for the options left at auto
    (models.preprocessing)."""
    source = DATASETS[cfg.name]
    opts = cfg.options
    if getattr(opts, "targets", None) == "auto":  # e.g. a CSV's label column: the task decides
        opts = replace(opts, targets=targets)
    if prep and hasattr(source, "from_model"):  # a pretrained model's input size, mean, std
        opts = source.from_model(opts, prep)
    own_val = getattr(source, "has_val_split", lambda _: True)(opts)
    saved, like = meta, meta if meta is not None else like
    if own_val and cfg.folds < 2:
        train, val = source(opts, "train"), source(opts, "val")
        match_inputs(train, like)  # then the validation table as the training table reads
        named = isinstance(like, dict) and isinstance(like.get("features"), list)
        match_inputs(val, getattr(train, "meta", None), "the checkpoint" if named else "")
        meta = _prepare(train, range(len(train)), saved)
        _prepare(val, None, meta)
        check_own_val(len(val), saved)
        stats = target_stats(train, range(len(train)), targets, saved)
        return train, val, {**meta, **stats, "val_samples": len(val), **tuned(like)}
    pool = source(opts, "train" if own_val else "all")
    match_inputs(pool, like)
    train_idx, val_idx, split = _split(pool, cfg)
    check_split(split, saved)
    meta = {**_prepare(pool, train_idx, saved), **target_stats(pool, train_idx, targets, saved)}
    return Split(pool, train_idx), Split(pool, val_idx), {**meta, "split": split, **tuned(like)}


def tuned(like: dict | None) -> dict:
    """What the task tuned on validation (a decision threshold) in the checkpoint evaluated,
    resumed or fine-tuned: kept until the next validation tunes it again."""
    return {"tuned": like["tuned"]} if isinstance(like, dict) and "tuned" in like else {}


def build_test_set(
    cfg, targets: str, meta: dict, path: str | None = None, source_name: str = "the checkpoint"
):
    """The held-out test split (data.test_path of a table or a text, an image folder's test/)
    read with `meta`'s preprocessing (the training run's, or a checkpoint's), or None when
    the data has none. Never trained on, never used to choose best.pt. `path`: another
    labelled file or folder to score instead (evaluate.py --data)."""
    source = DATASETS[cfg.name]
    opts = cfg.options
    if getattr(opts, "targets", None) == "auto":
        opts = replace(opts, targets=targets)
    if path is not None:
        option = getattr(source, "test_option", None)
        if option is None:
            raise ConfigError(
                f"data.name={cfg.name} reads no other labelled file; evaluate.py --data is "
                "for CSV tables, text files and image folders"  # feature: text
                "for CSV tables and image folders"  # feature: !text
            )
        opts = replace(opts, **{option: path})
    if not getattr(source, "has_test_split", lambda _: False)(opts):
        return None
    test = source(opts, "test")
    match_inputs(test, meta, source_name)
    _prepare(test, None, meta)
    return test


def match_inputs(dataset, like: dict | None, source: str = "the checkpoint") -> None:
    """Read `dataset`'s inputs as the model of `like` (a data meta) reads them: the one
    comparison of a run's data with a checkpoint's that its inputs depend on by name, for a
    resume, train.init_from, evaluation and a validation table alike. A CSV table's feature
    columns are taken in the checkpoint's order, and refused when their names differ.
    `source`: where `like` comes from, for the error ("" for the training table)."""
    names = like.get("features") if isinstance(like, dict) else None
    if isinstance(names, list) and hasattr(dataset, "match_columns"):
        dataset.match_columns(names, source or "the training table (data.path)")


class Split(Subset):
    """torch's Subset that also passes on `(index, seed)` items (see ShardedSampler)."""

    def __getitem__(self, item):
        if isinstance(item, tuple):
            return self.dataset[(self.indices[item[0]], item[1])]
        return super().__getitem__(item)

    def __getitems__(self, items: list) -> list:
        # torch's contract: one sample per item, collated by the DataLoader afterwards.
        return [self[item] for item in items]


def _split(pool: Dataset, cfg) -> tuple[list[int], list[int], dict]:
    n = len(pool)
    if cfg.folds >= 2:
        if cfg.folds > n:
            raise ConfigError(f"data.folds={cfg.folds} exceeds the {n} training samples")
        fold_of = assign_folds(n, cfg.folds, cfg.split_seed, class_labels(pool))
        val = (fold_of == cfg.fold).nonzero().squeeze(1).tolist()
        train = (fold_of != cfg.fold).nonzero().squeeze(1).tolist()
    elif hasattr(pool, "holdout"):  # e.g. text: a contiguous tail, not scattered windows
        train, val = pool.holdout(cfg.val_fraction)
    else:
        train, val = holdout(n, cfg.val_fraction, cfg.split_seed, class_labels(pool))
    if not train or not val:
        raise ConfigError(
            f"the split of {n} samples leaves {len(train)} for training and {len(val)} for "
            "validation; use more data or change data.val_fraction"
        )
    # A checksum of the validation rows: evaluation refuses a split that differs (data changed).
    checksum = zlib.crc32(torch.tensor(val, dtype=torch.int64).numpy().tobytes())
    return train, val, {"train": len(train), "val": len(val), "checksum": checksum}


def check_split(split: dict, meta: dict | None, fix: str = OTHER_ROWS) -> None:
    """Refuse a validation split other than the one recorded in a checkpoint's `meta`: it
    has the same sizes and the same validation rows (a checksum of their indices)."""
    saved = (meta or {}).get("split")
    if saved and saved != split:
        raise ConfigError(
            f"the validation split differs from the training run's ({split['val']} samples now, "
            f"{saved['val']} then): the data or data.val_fraction/split_seed/folds changed; "
            f"{fix}"
        )


def _prepare(dataset, indices, meta: dict | None) -> dict:
    if hasattr(dataset, "prepare"):
        return dataset.prepare(indices, meta)
    return dict(getattr(dataset, "meta", {}))


def source_of(dataset: Dataset) -> Dataset:
    """The dataset behind any Subset: where num_classes, classes and meta live."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def build_loader(
    dataset: Dataset,
    cfg,
    batch_size: int,
    train: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> DataLoader:
    """Training loaders shuffle per epoch and drop the ragged last batch so every rank steps
    the same number of times; evaluation loaders keep every sample exactly once."""
    # Datasets with random augmentation get a seed with each index (`seeded_items`).
    seeded = train and getattr(source_of(dataset), "seeded_items", False)
    labels = train_labels(dataset) if train and cfg.sampler == "balanced" else None
    sampler = ShardedSampler(len(dataset), rank, world_size, train, seed, train, seeded, labels)
    batching = dict(batch_size=batch_size, sampler=sampler, drop_last=train)
    if isinstance(source_of(dataset), InMemoryDataset):
        # Whole batches of indices go to dataset[...] (one gather); torch's documented way
        # to load in batches: a BatchSampler as the sampler and automatic batching off.
        batching = dict(batch_size=None, sampler=BatchSampler(sampler, batch_size, train))
    workers = cfg.num_workers
    check_workers(workers)  # before a worker starts: a count the machine cannot run is refused
    check_batch_memory(getattr(source_of(dataset), "sample_bytes", None), batch_size, workers)
    return _Loader(
        dataset,
        **batching,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,  # keep workers (and their warm caches) across epochs
        worker_init_fn=_init_worker,
        # A private generator: worker seeds come from (seed, rank), not the global RNG stream;
        # the extra part keeps it apart from the rank's own seed (trainer.prepare_process).
        generator=torch.Generator().manual_seed(mix_seed(seed, rank, LOADER_STREAM)),
    )


def drop_note(dataset, loader: DataLoader, batch_size: int, world_size: int) -> str:
    """The run line's note on the samples a training loader drops each epoch (its ragged last
    batch: ranks step together, and BatchNorm refuses a batch of one), or "" for none."""
    samples = len(dataset)
    dropped = max(samples - len(loader) * batch_size * world_size, 0)
    note = f" | drops {dropped} of {samples} samples an epoch (its last partial batch)"
    return note if dropped else ""


class _Loader(DataLoader):
    """torch's DataLoader whose worker processes are forked with the stop signals blocked
    (utils/signals.deferred_in_children): a SIGTERM to the whole job while they start must
    not kill them."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        with deferred_in_children():
            return super().__iter__()


def close_loader(loader: DataLoader) -> None:
    """End `loader`'s worker processes now. Persistent workers live as long as the loader, and
    an error raised in a worker holds the loader in a reference cycle until exit, where
    multiprocessing's SIGTERM cannot end them (_init_worker ignores it): the exit would hang."""
    if not isinstance(loader, DataLoader):  # a wrapper that holds it as .loader
        loader = getattr(loader, "loader", loader)
    iterator = getattr(loader, "_iterator", None)
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()  # torch's own shutdown: tell the workers to stop, join them
    loader._iterator = None


def example_inputs(dataset: Dataset, n: int = 2) -> torch.Tensor:
    """The inputs of the first `n` samples as a batch: what a model is tried on when built."""
    return example_batch(dataset, n)[0]


def example_batch(dataset: Dataset, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the first `n` samples as a batch. A dataset may draw random
    numbers (augmentation): torch's RNG is left as it was, so taking an example never shifts
    the random stream a resumed run restores."""
    if getattr(source_of(dataset), "variable_length", False):  # padded as a batch is
        return dataset[list(range(min(n, len(dataset))))]
    with torch.random.fork_rng(devices=[]):
        xs, ys = zip(*(dataset[i] for i in range(min(n, len(dataset)))), strict=True)
    return torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])


def empty_batch(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of no samples with the shapes and dtypes of `dataset`'s: for a rank whose shard
    is empty, so that it still takes part in collective evaluation (adds nothing to sums)."""
    x, y = dataset[0]
    return torch.as_tensor(x)[None][:0], torch.as_tensor(y)[None][:0]


def set_epoch(loader: DataLoader, epoch: int, start: int = 0) -> None:
    """Shuffle `loader` for `epoch`, skipping the first `start` samples of its global order."""
    sampler = loader.sampler
    if isinstance(sampler, BatchSampler):
        sampler = sampler.sampler
    sampler.set_epoch(epoch, start)


def _init_worker(worker_id: int) -> None:
    seed_worker(worker_id)
    ignore_stop_signals()  # the training process saves on SIGTERM; workers must outlive it
