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

import torch

# Below this many positives in the validation split a tuned threshold rests on a handful of
# scores; the run says so in one line (see `tuning_note`).
MIN_TUNING_POSITIVES = 10


def curve(scores: torch.Tensor, targets: torch.Tensor):
    """(thresholds, true positives, false positives): at each distinct score, highest first,
    the counts of `score >= threshold`; scikit-learn's `_binary_clf_curve`."""
    order = torch.argsort(scores, descending=True, stable=True)
    s, y = scores[order], targets[order].to(torch.float64)
    last = torch.ones(len(s), dtype=torch.bool)  # the last of each run of equal scores
    last[:-1] = s[1:] != s[:-1]
    tp = y.cumsum(0)[last]
    fp = torch.arange(1, len(s) + 1, dtype=torch.float64)[last] - tp
    return s[last], tp, fp


def auroc(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """Area under the ROC curve (tied scores count half), nan without positives or negatives
    (scikit-learn refuses those: the area is undefined)."""
    _, tp, fp = curve(scores, targets)
    if not len(tp) or tp[-1] == 0 or fp[-1] == 0:
        return math.nan
    zero = torch.zeros(1, dtype=torch.float64)
    tpr, fpr = torch.cat([zero, tp / tp[-1]]), torch.cat([zero, fp / fp[-1]])
    return torch.trapezoid(tpr, fpr).item()


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """Sum over the distinct thresholds of the recall gained times the precision there; 0
    for a label without positives, as scikit-learn (which warns)."""
    _, tp, fp = curve(scores, targets)
    if not len(tp) or tp[-1] == 0:
        return 0.0
    recall = tp / tp[-1]
    gained = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
    return (gained * tp / (tp + fp)).sum().item()


def best_threshold(scores: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """(threshold, F1) maximising F1 of `score >= threshold`. Every threshold between the
    lowest score predicted positive and the highest predicted negative makes the same
    decisions here; the midpoint of that gap is taken (not its edge, which would sit on a
    validation score), as a float32 that still separates them. 0.5 and F1 0 without
    positives."""
    s, tp, fp = curve(scores.float(), targets)
    if not len(tp) or tp[-1] == 0:
        return 0.5, 0.0
    f1 = 2 * tp / (tp + fp + tp[-1])
    best = int(torch.argmax(f1))  # the first maximum: the highest of tied thresholds
    end = best  # equal F1 on the next cuts too: one plateau
    while end + 1 < len(f1) and f1[end + 1] == f1[best]:
        end += 1
    high = s[best].item()
    low = s[end + 1].item() if end + 1 < len(s) else min(0.0, high)
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
