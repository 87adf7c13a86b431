"""K-fold splits: data.folds=K data.fold=i validates on fold i of the training split."""

from __future__ import annotations

import re

import pytest
import torch

from {{ cookiecutter.package_name }} import checkpoint, cli
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_dataset
from {{ cookiecutter.package_name }}.data.folds import IndexedSubset, fold_split
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit

SMALL = ["data.train_size=200", "data.val_size=30", "data.image_size=4", "data.num_classes=4"]


def splits(*overrides: str, folds: int = 3):
    """(train, val) datasets of every fold."""
    out = []
    for i in range(folds):
        cfg = load_config(None, [*SMALL, f"data.folds={folds}", f"data.fold={i}", *overrides])
        out.append((build_dataset(cfg.data, "train"), build_dataset(cfg.data, "val")))
    return out


def rows(dataset) -> set[int]:
    return set(dataset.indices.tolist())


def test_validation_folds_are_disjoint_cover_the_pool_and_train_is_the_rest():
    pool = build_dataset(load_config(None, SMALL).data, "train")
    folds = splits()
    vals = [rows(val) for _, val in folds]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not vals[a] & vals[b]
    assert set().union(*vals) == set(range(len(pool)))
    for (train, val), val_rows in zip(folds, vals, strict=True):
        assert rows(train) == set(range(len(pool))) - val_rows
        # The subsets hold the pool's own samples, and keep what the model is built from.
        assert torch.equal(val.x, pool.x[val.indices]) and torch.equal(val.y, pool.y[val.indices])
        assert (val.input_shape, val.num_classes) == (pool.input_shape, pool.num_classes)
    assert sorted(len(val) for _, val in folds) == [66, 67, 67]  # 200 samples: sizes within 1


def test_every_fold_holds_each_class_to_within_one_sample():
    pool_y = build_dataset(load_config(None, SMALL).data, "train").y
    share = torch.bincount(pool_y, minlength=4) / 3
    for _, val in splits():
        counts = torch.bincount(val.y, minlength=4)
        assert ((counts - share).abs() < 1).all(), (counts, share)


def test_folds_repeat_and_ignore_run_seed_but_follow_fold_seed():
    first = [rows(val) for _, val in splits()]
    assert [rows(val) for _, val in splits()] == first
    assert [rows(val) for _, val in splits("run.seed=7")] == first
    assert [rows(val) for _, val in splits("data.fold_seed=1")] != first


def test_datasets_without_x_and_y_are_split_by_index():
    class Pool(torch.utils.data.Dataset):
        input_shape, num_classes = (1,), 2

        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i % 2

    cfg = load_config(None, ["data.folds=3", "data.fold=2"]).data
    val, train = fold_split(Pool(), cfg, "val"), fold_split(Pool(), cfg, "train")
    assert isinstance(val, IndexedSubset) and not hasattr(val, "__getitems__")
    assert sorted(val.indices + train.indices) == list(range(10))
    assert [int(val[i][0]) for i in range(len(val))] == val.indices


def test_a_fold_run_validates_on_its_fold_and_evaluate_rebuilds_it(tiny):
    fold = ["data.folds=3", "data.fold=1", "train.epochs=1", "run.name=fold1"]
    cfg = load_config(None, [*tiny, *fold])
    result = fit(cfg)
    expected = len(build_dataset(cfg.data, "val"))
    assert result["metrics"]["count"] == expected
    assert expected < cfg.data.train_size // 2  # a fold of the pool, not the val split
    best = cfg.run.output_dir + "/fold1/best.pt"
    assert checkpoint.load(best)["config"]["data"]["fold"] == 1
    assert cli.evaluate_checkpoint(best)["count"] == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.folds=1"], "data.folds must be 0 (off) or >= 2, got 1"),
        (["data.folds=3", "data.fold=3"], "data.fold must be between 0 and data.folds - 1 = 2"),
        (["data.folds=3", "data.fold=-1"], "data.fold must be between 0 and data.folds - 1"),
        (["data.fold=2"], "data.fold must be 0 while data.folds is 0"),
        (["data.fold_seed=-1"], "data.fold_seed must be between 0 and 2**63 - 1"),
    ],
)
def test_bad_fold_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_more_folds_than_samples_is_refused():
    cfg = load_config(None, [*SMALL, "data.train_size=4", "data.folds=5"])
    with pytest.raises(ConfigError, match="data.folds=5 exceeds the 4 training samples"):
        build_dataset(cfg.data, "val")
