"""Tasks: each loss is what it says, and metrics from sums over uneven parts (batches, ranks)
equal the metrics of the whole split computed directly."""

from __future__ import annotations

import math  # feature: text
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }} import distributed
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tasks import TASKS, build_task
from {{ cookiecutter.package_name }}.validation import Totals


def task(name: str, *overrides: str, meta: dict | None = None, **data):
    cfg = load_config(None, [f"task.name={name}", *overrides])
    return build_task(cfg.task, SimpleNamespace(**data), meta)


def in_parts(t, output, y, cuts=(3, 10, 11)):
    """Metrics from sums over uneven parts, as evaluate adds batches (validation.Totals)."""
    bounds = [0, *cuts, len(y)]
    totals, names = Totals(t, torch.device("cpu")), None
    for a, b in zip(bounds, bounds[1:], strict=False):
        part = t.sums(output[a:b], y[a:b])
        names = names or set(part)
        assert set(part) == names, part.keys()  # the same names in every part
        added = {k: v for k, v in part.items() if k not in getattr(t, "gathered", ())}
        assert all(v.dtype == torch.float64 for v in added.values()), part  # float64 sums
        totals.add(part, output[a:b])
    return totals.metrics()


def test_classification_metrics_match_a_direct_computation():
    torch.manual_seed(0)
    logits, y = torch.randn(17, 4), torch.randint(4, (17,))
    metrics = in_parts(task("classification", num_classes=4), logits, y)
    assert metrics["count"] == 17
    assert metrics["acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert metrics["loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)


def test_label_smoothing_changes_the_training_loss_not_the_reported_one():
    logits, y = torch.randn(8, 3), torch.randint(3, (8,))
    plain, smooth = (
        task("classification", num_classes=3),
        task("classification", "task.label_smoothing=0.2", num_classes=3),
    )
    assert smooth.loss(logits, y) != pytest.approx(plain.loss(logits, y).item())
    assert in_parts(smooth, logits, y, cuts=()) == in_parts(plain, logits, y, cuts=())


@pytest.mark.parametrize("mean", [2000.0, 1e5])
@pytest.mark.parametrize("saved", [False, True])
def test_regression_r2_is_exact_for_targets_far_from_zero(mean, saved):
    """SST from float32 sums of y and y² cancels: for targets around 2000 a true R² of 0.91
    read 0.97, around 1e5 0.995. Float64 sums, shifted by the training targets' mean where
    the checkpoint has it (`saved`), match a float64 computation over uneven batches."""
    rng = np.random.default_rng(0)
    y64 = mean + 10 * rng.standard_normal((1000, 1))
    pred64 = y64 + 3 * rng.standard_normal((1000, 1))  # R² about 0.91
    meta = {"target_mean": [mean + 1.0], "target_std": [9.0]} if saved else None
    t = task("regression", num_targets=1, meta=meta)
    scale, shift = (9.0, mean + 1.0) if saved else (1.0, 0.0)
    output = torch.tensor((pred64 - shift) / scale, dtype=torch.float32)  # the model's units
    y = torch.tensor(y64, dtype=torch.float32)
    metrics = in_parts(t, output, y, cuts=(3, 500, 777))
    pred, true = output.double().numpy() * scale + shift, y.double().numpy()
    sse = ((pred - true) ** 2).sum()
    assert metrics["r2"] == pytest.approx(1 - sse / ((true - true.mean()) ** 2).sum(), abs=1e-6)
    assert metrics["rmse"] == pytest.approx(np.sqrt(sse / 1000), rel=1e-6)


@pytest.mark.parametrize("targets", [1, 3])
def test_regression_metrics_match_a_direct_computation(targets):
    torch.manual_seed(1)
    y = torch.randn(17, targets) * 3 + 1
    pred = y + torch.randn(17, targets)
    metrics = in_parts(task("regression", num_targets=targets), pred, y)
    err = pred - y
    sst = ((y - y.mean(0)) ** 2).sum()
    assert metrics["rmse"] == pytest.approx(err.square().mean().sqrt().item(), rel=1e-5)
    assert metrics["mae"] == pytest.approx(err.abs().mean().item(), rel=1e-5)
    assert metrics["r2"] == pytest.approx(1 - (err.square().sum() / sst).item(), rel=1e-4)
    assert metrics["loss"] == pytest.approx(F.mse_loss(pred, y).item(), rel=1e-5)


def test_regression_learns_standardised_targets_and_decodes_to_their_units():
    meta = {"target_mean": [150.0, -3.0], "target_std": [80.0, 2.0]}
    y = torch.tensor([[150.0, -3.0], [230.0, 1.0]])
    output = torch.tensor([[0.0, 0.0], [1.0, 2.0]])  # exactly right, in standardised units
    t = task("regression", num_targets=2, meta=meta)
    assert t.loss(output, y).item() == 0.0
    assert torch.equal(t.decode(output), y.double())
    # Switched off, or a checkpoint from before target statistics: raw targets.
    for raw in (task("regression", "task.standardize_targets=false", num_targets=2, meta=meta),
                task("regression", num_targets=2, meta={"features": ["a"]})):  # fmt: skip
        assert raw.loss(output, y).item() == pytest.approx(F.mse_loss(output, y).item())
        assert torch.equal(raw.decode(output), output.double())


@pytest.mark.parametrize(
    ("name", "data", "output", "y"),
    [
        (
            "classification",
            {"num_classes": 3},
            torch.zeros(0, 3),
            torch.zeros(0, dtype=torch.long),
        ),
        ("regression", {"num_targets": 2}, torch.zeros(0, 2), torch.zeros(0, 2)),
        ("language_model", {"vocab_size": 5}, torch.zeros(0, 4, 5), torch.zeros(0, 4).long()),  # feature: text
    ],
)
def test_a_rank_without_samples_sums_zeros_of_the_same_names_and_shapes(name, data, output, y):
    """evaluate on a rank with no validation sample all-reduces these zeros with the other
    ranks' sums: the same names and shapes, or the single all-reduce would not line up."""
    t = task(name, **data)
    empty, full = (
        t.sums(output, y),
        t.sums(torch.ones(2, *output.shape[1:]), y.new_ones(2, *y.shape[1:])),
    )
    assert empty.keys() == full.keys()
    for key, value in empty.items():
        assert value.shape == full[key].shape and value.dtype == torch.float64, key
        assert not value.any(), key


def test_regression_accepts_n_targets_for_one_output_and_huber():
    pred, y = torch.randn(6, 1), torch.randn(6)
    t = task("regression", "task.loss=huber", "task.huber_delta=0.5", num_targets=1)
    assert t.loss(pred, y).item() == pytest.approx(F.huber_loss(pred[:, 0], y, delta=0.5).item())


# >>> text
def test_language_model_perplexity_is_exp_of_the_mean_token_loss():
    torch.manual_seed(2)
    logits, y = torch.randn(5, 7, 11), torch.randint(11, (5, 7))
    metrics = in_parts(task("language_model", vocab_size=11), logits, y, cuts=(1, 2))
    loss = F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1)).item()
    assert metrics["count"] == 35 and metrics["loss"] == pytest.approx(loss, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
# <<< text


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("classification", {"num_targets": 1}, r"values \(floats\); use task.name=regression"),
        ("regression", {"num_classes": 3}, "task.name=regression needs numeric targets"),
        ("language_model", {"num_classes": 3}, "needs token data with a vocab_size"),  # feature: text
        ("multilabel", {"num_classes": 3}, "needs a 0/1 vector of labels per sample"),  # feature: multilabel
    ],
)
def test_a_task_refuses_data_it_cannot_learn_from_in_one_line(name, data, message):
    with pytest.raises(ConfigError, match=message):
        task(name, **data)


def test_every_task_declares_what_the_loop_needs():
    for name, cls in TASKS.items():
        assert cls.targets in ("class", "value", "labels", "tokens"), name
        assert cls.metrics and set(cls.metrics.values()) <= {"max", "min"}, name
        assert "loss" in cls.metrics, name


def test_named_sums_travel_in_one_all_reduce_and_come_back_by_name():
    """distributed.all_reduce_sums: one flat tensor in key order (the same on every rank,
    whatever order each dict was built in), split back into the original shapes."""
    import torch.distributed as dist

    sums = {"y_sq": torch.tensor([4.0, 5.0]), "count": torch.tensor(3.0), "a": torch.ones(1, 2)}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        reduced = distributed.all_reduce_sums(sums)
    finally:
        dist.destroy_process_group()
    assert list(reduced) == ["a", "count", "y_sq"]
    for key, value in sums.items():
        assert torch.equal(reduced[key], value), key
