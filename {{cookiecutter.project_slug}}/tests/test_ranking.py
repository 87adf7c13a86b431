"""The histogram's ranking metrics agree with scikit-learn within the bound that
tasks/ranking.py states (1e-3 on 10^5 samples), heavy ties and extreme imbalance included,
and add up over parts (batches, ranks) exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from {{ cookiecutter.package_name }}.tasks import ranking

metrics = pytest.importorskip("sklearn.metrics")

N = 100_000
TOLERANCE = 1e-3  # the bound the README and ranking.py state


def scores(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scores in [0, 1], 0/1 targets) of N samples."""
    if kind == "balanced_logistic":
        y = rng.random(N) < 0.5
        return 1 / (1 + np.exp(-(rng.normal(0, 1.5, N) + 1.2 * y))), y
    if kind == "rare_positives":  # 0.5 % positives, as fraud tables have
        y = rng.random(N) < 0.005
        return 1 / (1 + np.exp(-(rng.normal(-3, 1.2, N) + 2.5 * y))), y
    if kind == "ten_percent_beta":
        y = rng.random(N) < 0.1
        return np.where(y, rng.beta(5, 2, N), rng.beta(2, 5, N)), y
    if kind == "heavy_ties":  # a coarse model: 11 distinct scores
        y = rng.random(N) < 0.3
        return np.round(np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1), 1), y
    if kind == "uniform_noise":  # no signal: AUROC 0.5
        return rng.random(N), rng.random(N) < 0.2
    raise ValueError(kind)


KINDS = ["balanced_logistic", "rare_positives", "ten_percent_beta", "heavy_ties", "uniform_noise"]


@pytest.mark.parametrize("kind", KINDS)
def test_auroc_and_average_precision_match_sklearn_within_the_stated_bound(kind):
    p, y = scores(kind, np.random.default_rng(KINDS.index(kind)))
    hist = ranking.histogram(torch.tensor(p, dtype=torch.float32), torch.tensor(y))
    assert hist.shape == (1, 2, ranking.BINS) and hist.dtype == torch.float64
    # sklearn on the float32 scores the histogram saw: the error is the binning's alone.
    p32 = p.astype(np.float32)
    auc, ap = ranking.auroc(hist)[0], ranking.average_precision(hist)[0]
    exact_auc = metrics.roc_auc_score(y, p32)
    assert abs(auc - exact_auc) <= min(TOLERANCE, ranking.auroc_error_bound(hist)[0] + 1e-12)
    assert abs(ap - metrics.average_precision_score(y, p32)) <= TOLERANCE
    threshold, f1 = (v[0] for v in ranking.best_threshold(hist))
    # The threshold's F1 is exact on the raw scores, and as good as sklearn's best.
    assert f1 == pytest.approx(metrics.f1_score(y, p32 >= threshold), abs=1e-12)
    precision, recall, _ = metrics.precision_recall_curve(y, p32)
    best = np.max(2 * precision * recall / np.maximum(precision + recall, 1e-300))
    assert best - TOLERANCE <= f1 <= best + 1e-12


def test_the_histogram_of_parts_sums_to_the_histogram_of_the_whole_for_several_labels():
    g = torch.Generator().manual_seed(0)
    p, y = torch.rand(1000, 3, generator=g), torch.rand(1000, 3, generator=g) < 0.3
    whole = ranking.histogram(p, y)
    parts = sum(ranking.histogram(p[a : a + 97], y[a : a + 97]) for a in range(0, 1000, 97))
    assert torch.equal(whole, parts) and whole.shape == (3, 2, ranking.BINS)
    assert whole[:, 1].sum(-1).tolist() == y.sum(0).double().tolist()
    for label in range(3):
        assert ranking.auroc(whole.tolist())[label] == pytest.approx(
            metrics.roc_auc_score(y[:, label], p[:, label]), abs=TOLERANCE
        )


def test_confusion_at_a_threshold_is_exact_and_labels_without_positives_are_nan():
    p, y = torch.tensor([0.1, 0.4, 0.5, 0.5, 0.9, 1.0]), torch.tensor([0, 1, 0, 1, 1, 1])
    hist = ranking.histogram(p, y)
    cm = ranking.confusion_at(hist, [0.5])[0]
    assert cm.tolist() == [[1, 1], [1, 3]]  # true neg row: 0.1 below, 0.5 at; pos: 0.4 below
    empty = ranking.histogram(torch.rand(5), torch.zeros(5))
    assert np.isnan(ranking.auroc(empty)[0]) and np.isnan(ranking.average_precision(empty)[0])
    assert ranking.best_threshold(empty) == ([0.5], [0.0])


def test_a_rank_with_no_samples_adds_an_empty_histogram():
    # An uneven split leaves a rank no validation samples; reshape(0, -1) would raise there.
    for scores in (torch.empty(0), torch.empty(0, 3)):
        hist = ranking.histogram(scores, torch.empty(scores.shape, dtype=torch.long))
        assert hist.shape == (1 if scores.dim() == 1 else 3, 2, ranking.BINS)
        assert hist.sum() == 0
