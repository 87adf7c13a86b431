"""Validation splits: a dataset's own, a held-out fraction of one pool, or k folds."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import Dataset, Subset

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_datasets, build_loader
from {{ cookiecutter.package_name }}.data.synthetic import SyntheticGratings
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint
from {{ cookiecutter.package_name }}.trainer import fit

SMALL = ["data.train_size=200", "data.val_size=30", "data.image_size=4", "data.num_classes=4"]


def splits(*overrides: str, folds: int = 3):
    """(train, val) datasets of every fold."""
    out = []
    for i in range(folds):
        cfg = load_config(None, [*SMALL, f"data.folds={folds}", f"data.fold={i}", *overrides])
        train, val, _ = build_datasets(cfg.data, "class")
        out.append((train, val))
    return out


def rows(dataset: Subset) -> set[int]:
    return set(dataset.indices)


def pool() -> SyntheticGratings:
    return SyntheticGratings(load_config(None, SMALL).data.options, "train")


def test_validation_folds_are_disjoint_cover_the_pool_and_train_is_the_rest():
    folds, n = splits(), len(pool())
    vals = [rows(val) for _, val in folds]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not vals[a] & vals[b]
    assert set().union(*vals) == set(range(n))
    for (train, val), val_rows in zip(folds, vals, strict=True):
        assert rows(train) == set(range(n)) - val_rows
        x, y = val[list(range(len(val)))]  # a batch by index list: the pool's own samples
        assert torch.equal(x, pool().x[val.indices]) and torch.equal(y, pool().y[val.indices])
    assert sorted(len(val) for _, val in folds) == [66, 67, 67]  # 200 samples: sizes within 1


def test_every_fold_holds_each_class_to_within_one_sample():
    share = torch.bincount(pool().y, minlength=4) / 3
    for _, val in splits():
        counts = torch.bincount(pool().y[val.indices], minlength=4)
        assert ((counts - share).abs() < 1).all(), (counts, share)


def test_folds_repeat_and_ignore_run_seed_but_follow_split_seed():
    first = [rows(val) for _, val in splits()]
    assert [rows(val) for _, val in splits()] == first
    assert [rows(val) for _, val in splits("run.seed=7")] == first
    assert [rows(val) for _, val in splits("data.split_seed=1")] != first


class OnePool(Dataset):
    """A dataset with one pool and no x/y tensors: 90 samples of classes 0, 1, 2 (30 each)."""

    num_classes = 3
    has_val_split = staticmethod(lambda opts: False)

    def __init__(self, opts, split):
        assert split == "all"
        self.y = torch.arange(90) % 3

    def __len__(self):
        return 90

    def __getitem__(self, i):
        return torch.tensor([float(i)]), self.y[i]


def test_a_single_pool_holds_out_a_stratified_seeded_fraction(monkeypatch):
    from {{ cookiecutter.package_name }} import data

    monkeypatch.setitem(data.DATASETS, "tensors", OnePool)  # a registered name with options
    cfg = load_config(None, ["data.name=tensors", "data.val_fraction=0.2"]).data
    train, val, meta = build_datasets(cfg, "class")
    assert len(val) == 18 and sorted(train.indices + val.indices) == list(range(90))
    assert torch.bincount(torch.tensor(val.indices) % 3).tolist() == [6, 6, 6]  # stratified
    assert meta["split"]["val"] == 18 and meta["split"]["train"] == 72
    again = build_datasets(cfg, "class")[1].indices
    other = build_datasets(
        load_config(
            None, ["data.name=tensors", "data.split_seed=3", "data.val_fraction=0.2"]
        ).data,
        "class",
    )[1].indices
    assert again == val.indices and other != val.indices
    # Evaluation with the run's meta refuses a split that is not the run's.
    with pytest.raises(ConfigError, match="validation split differs"):
        bigger = load_config(None, ["data.name=tensors", "data.val_fraction=0.3"]).data
        build_datasets(bigger, "class", meta)


def test_subsets_of_in_memory_data_load_in_batches_with_workers_too():
    """torch's Subset of an in-memory dataset: the loader still fetches whole batches (one
    gather), and samples come out as a dataset[i] would give them."""
    cfg = load_config(None, [*SMALL, "data.folds=2"]).data
    train, _, _ = build_datasets(cfg, "class")
    assert isinstance(train, Subset)
    for workers in (0, 2):
        loader = build_loader(
            train, load_config(None, [f"data.num_workers={workers}"]).data, 16, train=False, seed=0
        )
        x, y = next(iter(loader))
        assert x.shape == (16, 3, 4, 4) and y.shape == (16,)
        first = train[0]
        assert torch.equal(x[0], first[0]) and int(y[0]) == int(first[1])


def test_a_fold_run_validates_on_its_fold_and_evaluate_rebuilds_it(tiny):
    fold = ["data.folds=3", "data.fold=1", "train.epochs=1", "run.name=fold1"]
    cfg = load_config(None, [*tiny, *fold])
    result = fit(cfg)
    expected = len(build_datasets(cfg.data, "class")[1])
    assert result["metrics"]["count"] == expected
    assert expected < cfg.data.options.train_size // 2  # a fold of the pool, not the val split
    best = cfg.run.output_dir + "/fold1/best.pt"
    state = checkpoint.load(best)
    assert state["config"]["data"]["fold"] == 1 and state["data"]["split"]["val"] == expected
    assert evaluate_checkpoint(best)["count"] == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.folds=1"], "data.folds must be 0 (off) or >= 2, got 1"),
        (["data.folds=3", "data.fold=3"], "data.fold must be between 0 and data.folds - 1 = 2"),
        (["data.folds=3", "data.fold=-1"], "data.fold must be between 0 and data.folds - 1"),
        (["data.fold=2"], "data.fold must be 0 while data.folds is 0"),
        (["data.split_seed=-1"], "data.split_seed must be between 0 and 2**63 - 1"),
        (["data.val_fraction=1"], "data.val_fraction must be between 0 and 1, exclusive"),
    ],
)
def test_bad_split_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_more_folds_than_samples_is_refused():
    cfg = load_config(None, [*SMALL, "data.train_size=4", "data.folds=5"])
    with pytest.raises(ConfigError, match="data.folds=5 exceeds the 4 training samples"):
        build_datasets(cfg.data, "class")
