"""Tasks: each loss is what it says, and metrics from sums over uneven parts (batches, ranks)
equal the metrics of the whole split computed directly."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tasks import TASKS, build_task


def task(name: str, *overrides: str, **data):
    cfg = load_config(None, [f"task.name={name}", *overrides])
    return build_task(cfg.task, SimpleNamespace(**data))


def in_parts(t, output, y, cuts=(3, 10, 11)):
    """Metrics from sums over uneven parts, as evaluate adds batches and all-reduces ranks."""
    bounds = [0, *cuts, len(y)]
    sums = sum(t.sums(output[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return t.summarise(sums.tolist())


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
    assert smooth.summarise(smooth.sums(logits, y).tolist()) == plain.summarise(
        plain.sums(logits, y).tolist()
    )


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


def test_regression_accepts_n_targets_for_one_output_and_huber():
    pred, y = torch.randn(6, 1), torch.randn(6)
    t = task("regression", "task.loss=huber", "task.huber_delta=0.5", num_targets=1)
    assert t.loss(pred, y).item() == pytest.approx(F.huber_loss(pred[:, 0], y, delta=0.5).item())


def test_language_model_perplexity_is_exp_of_the_mean_token_loss():
    torch.manual_seed(2)
    logits, y = torch.randn(5, 7, 11), torch.randint(11, (5, 7))
    metrics = in_parts(task("language_model", vocab_size=11), logits, y, cuts=(1, 2))
    loss = F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1)).item()
    assert metrics["count"] == 35 and metrics["loss"] == pytest.approx(loss, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("classification", {"num_targets": 1}, r"values \(floats\); use task.name=regression"),
        ("regression", {"num_classes": 3}, "task.name=regression needs numeric targets"),
        ("language_model", {"num_classes": 3}, "needs token data with a vocab_size"),
    ],
)
def test_a_task_refuses_data_it_cannot_learn_from_in_one_line(name, data, message):
    with pytest.raises(ConfigError, match=message):
        task(name, **data)


def test_every_task_declares_what_the_loop_needs():
    for name, cls in TASKS.items():
        assert cls.targets in ("class", "value", "tokens"), name
        assert cls.metrics and set(cls.metrics.values()) <= {"max", "min"}, name
        assert "loss" in cls.metrics, name
