"""data.sampler=balanced: classes drawn with equal probability (with replacement), seeded from
(run.seed, epoch), sharded and resumable like the shuffling sampler (data/sampler.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import stop_after

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_loader, train_labels
from {{ cookiecutter.package_name }}.data.sampler import ShardedSampler
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import build_data, fit

# A fraud-style target: 10% positives.
LABELS = (torch.arange(10_000) % 10 == 0).long()


def drawn(size=10_000, rank=0, world=1, epoch=0, start=0, seed=5, labels=LABELS, **kw):
    sampler = ShardedSampler(size, rank, world, seed=seed, labels=labels, **kw)
    sampler.set_epoch(epoch, start)
    return list(sampler)


def test_an_epoch_draws_each_class_equally_often_and_keeps_its_length():
    order = drawn()
    assert len(order) == len(LABELS)  # the epoch's length is unchanged
    positives = LABELS[torch.tensor(order)].float().mean().item()
    # Binomial(10,000, 0.5): std 0.005; 0.02 is four of them (the shuffle gives 0.10).
    assert abs(positives - 0.5) < 0.02, positives
    # Drawn with replacement: the 1,000 positives repeat, about 5 times each.
    assert len(set(order)) < 0.8 * len(order)
    shuffled = ShardedSampler(len(LABELS), seed=5)
    assert LABELS[torch.tensor(list(shuffled))].float().mean().item() == pytest.approx(0.1)


def test_the_draw_depends_on_seed_and_epoch_only():
    assert drawn() == drawn()
    assert drawn(epoch=1) != drawn(epoch=0)
    assert drawn(seed=6) != drawn(seed=5)
    # Every sample of every class can be drawn (none is left out for good).
    small = (torch.arange(50) % 10 == 0).long()
    seen = {i for epoch in range(20) for i in drawn(50, epoch=epoch, labels=small)}
    assert seen == set(range(50))


@pytest.mark.parametrize("size", [256, 97])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("start", [0, 40])
def test_ranks_read_disjoint_positions_of_one_draw(size, world, start):
    """The ranks' shards interleave to the one-process draw, from any start: a mid-epoch
    resume on another world size continues the same draw (as the shuffling sampler does)."""
    labels = (torch.arange(size) % 7 == 0).long()
    one = drawn(size, epoch=3, start=start, labels=labels)
    shards = [drawn(size, r, world, epoch=3, start=start, labels=labels) for r in range(world)]
    assert len({len(shard) for shard in shards}) == 1  # every rank steps as often
    merged = [shards[p % world][p // world] for p in range(world * len(shards[0]))]
    assert merged[: len(one)] == one[: len(merged)]
    assert len(merged) - len(one) < world  # padding only fills the last row


def test_repeated_draws_get_their_own_augmentation_seeds():
    items = drawn(size=100, labels=(torch.arange(100) < 10).long(), seeded=True)
    assert len({seed for _, seed in items}) == len(items)
    labels = (torch.arange(100) < 10).long()
    one = drawn(100, labels=labels, seeded=True, start=30)
    two = [drawn(100, r, 2, labels=labels, seeded=True, start=30) for r in range(2)]
    assert sorted(one) == sorted(two[0] + two[1])  # the same (sample, seed) on any world size


def test_the_loader_draws_from_the_training_splits_own_labels(tiny):
    cfg = load_config(None, [*tiny, "data.sampler=balanced"])
    train_set, _, _, _ = build_data(cfg)
    loader = build_loader(train_set, cfg.data, 16, train=True, seed=cfg.run.seed)
    labels = train_labels(train_set)
    assert labels.tolist() == [int(train_set[i][1]) for i in range(len(train_set))]
    assert loader.sampler.sampler.labels is not None


def test_balanced_is_refused_for_targets_that_are_not_classes(tiny):
    args = ["task.name=regression", "data.sampler=balanced", "model.name=mlp"]
    with pytest.raises(ConfigError, match="data.sampler=balanced draws by class") as info:
        load_config(None, [*tiny, *args])  # when the config is read, before any data
    assert "\n" not in str(info.value)


def test_the_sampler_cannot_change_on_resume(tiny):
    fit(load_config(None, [*tiny, "train.max_steps=3", "data.sampler=balanced"]))
    with pytest.raises(ConfigError, match="data.sampler=shuffle differs from the checkpoint's"):
        fit(load_config(None, [*tiny, "train.resume=auto"]))


@pytest.mark.slow
def test_a_balanced_run_resumed_mid_epoch_is_bitwise_the_uninterrupted_one(tiny, monkeypatch):
    exact = [*tiny, "run.deterministic=true", "train.epochs=2", "data.sampler=balanced"]
    straight = fit(load_config(None, [*exact, "run.name=straight"]))
    stopping = stop_after(monkeypatch, straight["step"] // 2 + 3)  # mid-epoch
    fit(load_config(None, [*exact, *stopping, "run.name=split"]))
    monkeypatch.undo()
    resumed = fit(load_config(None, [*exact, "run.name=split", "train.resume=auto"]))
    assert resumed["metrics"] == straight["metrics"]
    out = load_config(None, tiny).run.output_dir
    a = checkpoint.load(f"{out}/straight/last.pt")["model"]
    b = checkpoint.load(f"{out}/split/last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    shuffled = fit(load_config(None, [*tiny, "run.deterministic=true", "train.epochs=2"]))
    assert shuffled["metrics"] != straight["metrics"]  # the sampler did change the order
