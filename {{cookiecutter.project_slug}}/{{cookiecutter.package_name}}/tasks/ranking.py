"""Ranking metrics, exact: AUROC, average precision (AP) and the F1-best decision threshold
of one label, from every (score, 0/1 target) pair of the split, with one sort, as
scikit-learn computes them (`roc_auc_score`, `average_precision_score`).

Validation gathers the pairs over batches and ranks (a task's `gathered` sums,
validation.py), so these see the whole split once: 10^6 pairs are 8 MB and one sort.
Scores are float32 probabilities, compared as float32 (`decide` compares them so), and
counts are float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

# Below this many positives in the validation split a tuned threshold rests on a handful of
# scores; the run says so in one line (see `tuning_note`).
MIN_TUNING_POSITIVES = 10


class Curve(NamedTuple):
    """At each distinct score, highest first: the counts of `score >= threshold` (the
    curve scikit-learn's `_binary_clf_curve` gives)."""

    thresholds: torch.Tensor  # float32 scores
    tp: torch.Tensor  # float64 counts
    fp: torch.Tensor

    @property
    def positives(self) -> float:
        return self.tp[-1].item() if len(self.tp) else 0.0

    @property
    def negatives(self) -> float:
        return self.fp[-1].item() if len(self.fp) else 0.0


class Ranking(NamedTuple):
    auroc: float
    ap: float
    threshold: float  # F1-best (best_threshold)
    f1: float  # F1 at it


def curve(scores: torch.Tensor, targets: torch.Tensor) -> Curve:
    """The curve of float32 `scores` against 0/1 `targets` (1-D), from one sort."""
    order = torch.argsort(scores.float(), descending=True, stable=True)
    s, y = scores.float()[order], targets[order].to(torch.float64)
    last = torch.ones(len(s), dtype=torch.bool)  # the last of each run of equal scores
    last[:-1] = s[1:] != s[:-1]
    tp = y.cumsum(0)[last]
    fp = torch.arange(1, len(s) + 1, dtype=torch.float64)[last] - tp
    return Curve(s[last], tp, fp)


def rank(scores: torch.Tensor, targets: torch.Tensor) -> Ranking:
    """AUROC, AP and the F1-best threshold of one label, from one curve."""
    c = curve(scores, targets)
    return Ranking(_auroc(c), _average_precision(c), *_best_threshold(c))


def auroc(scores: torch.Tensor, targets: torch.Tensor) -> float:
    return _auroc(curve(scores, targets))


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float:
    return _average_precision(curve(scores, targets))


def best_threshold(scores: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    return _best_threshold(curve(scores, targets))


def _auroc(c: Curve) -> float:
    """Area under the ROC curve (tied scores count half), nan without positives or negatives
    (scikit-learn refuses those: the area is undefined)."""
    if c.positives == 0 or c.negatives == 0:
        return math.nan
    zero = torch.zeros(1, dtype=torch.float64)
    tpr, fpr = torch.cat([zero, c.tp / c.positives]), torch.cat([zero, c.fp / c.negatives])
    return torch.trapezoid(tpr, fpr).item()


def _average_precision(c: Curve) -> float:
    """Sum over the distinct thresholds of the recall gained times the precision there; 0
    for a label without positives, as scikit-learn (which warns)."""
    if c.positives == 0:
        return 0.0
    gained = torch.diff(c.tp / c.positives, prepend=torch.zeros(1, dtype=torch.float64))
    return (gained * c.tp / (c.tp + c.fp)).sum().item()


def _best_threshold(c: Curve) -> tuple[float, float]:
    """(threshold, F1) maximising F1 of `score >= threshold`. Every threshold between the
    lowest score predicted positive and the highest predicted negative makes the same
    decisions here; the midpoint of that gap is taken (not its edge, which would sit on a
    validation score), as a float32 that still separates them. 0.5 and F1 0 without
    positives."""
    if c.positives == 0:
        return 0.5, 0.0
    f1 = 2 * c.tp / (c.tp + c.fp + c.positives)
    best = int(torch.argmax(f1))  # the first maximum: the highest of tied thresholds
    end = best  # equal F1 on the next cuts too: one plateau
    while end + 1 < len(f1) and f1[end + 1] == f1[best]:
        end += 1
    high = c.thresholds[best].item()
    low = c.thresholds[end + 1].item() if end + 1 < len(f1) else min(0.0, high)
    middle = torch.tensor((high + low) / 2, dtype=torch.float32).item()
    return (middle if low < middle <= high else high), f1[best].item()


def tuning_note(option: str, positives: list[int]) -> str | None:
    """One line when a threshold was tuned on fewer than MIN_TUNING_POSITIVES positives
    (`positives`: per label), naming the fix; None otherwise."""
    fewest = min(positives, default=MIN_TUNING_POSITIVES)
    if fewest >= MIN_TUNING_POSITIVES:
        return None
    return (
        f"warning: {option}=auto was tuned on {fewest} positive(s) of the validation split "
        f"(fewer than {MIN_TUNING_POSITIVES}), so it may not hold on new data; give a larger "
        "data.val_fraction, a data.val_path with more positives, or a fixed threshold"
    )
