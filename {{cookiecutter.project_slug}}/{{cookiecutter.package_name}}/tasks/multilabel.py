"""Multi-label classification: each sample carries any number of L labels, a 0/1 target
vector (N, L) ("a photo of a beach and a dog"; a ticket that is both "billing" and
"urgent"). The model gives one logit per label (N, L); the loss is binary cross-entropy,
each label's positives optionally weighted (`task.pos_weight`); `decode` is the sigmoid, so
predictions give a probability per label.

Metrics, each validation, exact and as scikit-learn defines them: per label precision,
recall, F1 and average precision (AP), their micro- and macro-F1, the mean AP (map) and the
exact match ratio (every label of a sample right). Each sample's probabilities and targets
are gathered over batches and ranks (8 bytes per label), so every count comes from the
decisions themselves. Macro averages take every label, a label without positives included
(its F1 is 0 where nothing was predicted, its AP 0), as scikit-learn's `average="macro"`. A
label is predicted when its probability reaches its threshold: `task.threshold` for all, or
`auto`, each label's F1-best threshold on the validation split (tasks/ranking.py), saved in
the checkpoint's data meta and used by evaluate.py and predict.py (and an export's JSON);  # feature: export
the checkpoint's data meta and used by evaluate.py and predict.py;  # feature: !export
every metric of a validation that tunes them is counted at the thresholds it tuned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn  # feature: export

from ..errors import ConfigError
from ..utils.device import sums_dtype
from . import ranking
from .classification import in_order, threshold_check, weights_ok


@dataclass
class Options:
    # Loss weight of each label's positives: none | auto (negatives / positives of the
    # training split, per label) | [w per label] | {label name: weight}. The val loss
    # reported is unweighted.
    pos_weight: list[float] | dict[str, float] | str = "none"
    # Predict a label when its probability >= threshold: one probability for all labels, or
    # auto: per label, the threshold maximising its F1 on the validation split (saved).
    threshold: float | str = 0.5

    def checks(self):
        return [
            (
                "pos_weight",
                weights_ok(self.pos_weight, zero_ok=False),
                "none, auto, a list of weights > 0 or a mapping {label name: weight}",
            ),
            threshold_check(self.threshold),
        ]


class MultiLabel:
    Options = Options
    targets = "labels"
    metrics = {
        "map": "max",  # mean average precision: threshold-free, so it picks best.pt
        "loss": "min",
        "micro_f1": "max",
        "macro_f1": "max",
        "exact_match": "max",
        "precision": "max",
        "recall": "max",
        "f1": "max",
        "ap": "max",
    }
    vector_metrics = ("precision", "recall", "f1", "ap", "threshold")  # per label: f1/<label>
    gathered = ("scores",)  # sums kept per sample: concatenated over batches and ranks

    def __init__(self, opts: Options, data, meta: dict | None = None):
        # A CSV's label columns set num_labels; tensor files' float targets (N, L) num_targets.
        self.num_outputs = k = getattr(data, "num_labels", None) or getattr(
            data, "num_targets", None
        )
        if not k:
            raise ConfigError(
                "task.name=multilabel needs a 0/1 vector of labels per sample, which this "
                "dataset does not give; for a CSV set data.label to the label columns (a list) "
                "or to one column of labels joined by data.label_sep; for images data.labels"
            )
        self.meta = meta if meta is not None else {}
        names = self.meta.get("labels") or getattr(data, "label_names", None)
        self.label_names = [str(n) for n in names] if names else [str(i) for i in range(k)]
        self.pos_weight = pos_weights(opts.pos_weight, self.label_names, self.meta)
        self.tune = opts.threshold == "auto"
        saved = self.meta.get("tuned", {}).get("thresholds")
        fixed = 0.5 if self.tune else float(opts.threshold)  # auto before any validation
        self.thresholds = list(saved) if self.tune and saved is not None else [fixed] * k
        self.note = None  # one line about the last tuning (too few positives), or None
        self._copies = {}

    def _on(self, name: str, values, device: torch.device) -> torch.Tensor:
        key = (name, tuple(values), device)  # once per device and value: no copy per batch
        if key not in self._copies:
            self._copies[key] = torch.tensor(values, dtype=torch.float32, device=device)
        return self._copies[key]

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        weight = None
        if self.pos_weight is not None:
            weight = self._on("pos_weight", self.pos_weight, output.device).to(output.dtype)
        return F.binary_cross_entropy_with_logits(output, y.to(output.dtype), pos_weight=weight)

    def decode(self, output: torch.Tensor) -> torch.Tensor:
        return output.float().sigmoid()  # a probability per label

    def decide(self, probabilities: torch.Tensor) -> torch.Tensor:
        """0/1 decisions (N, L): each label where its probability reaches its threshold."""
        return (probabilities >= self._on("t", self.thresholds, probabilities.device)).long()

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        wide = sums_dtype(y.device)
        logits, truth = output.float(), y.float()
        return {
            "loss": F.binary_cross_entropy_with_logits(logits, truth, reduction="sum").to(wide),
            "count": torch.full((), len(y), dtype=wide, device=y.device),
            # (N, 2L): each sample's probabilities, then its 0/1 targets
            "scores": torch.cat([logits.sigmoid(), (truth > 0.5).float()], 1),
        }

    def summarise(self, sums: dict) -> dict:
        count, k = sums["count"], self.num_outputs
        rows = sums["scores"]
        scores, truth = rows[:, :k], rows[:, k:].long()
        ranked = [ranking.rank(scores[:, i], truth[:, i]) for i in range(k)]  # a sort a label
        if self.tune:  # each label's F1-best threshold on this split
            self.thresholds = [r.threshold for r in ranked]
            positives = truth.sum(0).tolist()
            self.meta["tuned"] = {"thresholds": self.thresholds, "positives": positives}
            self.note = ranking.tuning_note("task.threshold", positives)
        predicted, actual = self.decide(scores).bool(), truth.bool()
        tp, fp, fn = (
            m.sum(0).to(torch.float64)
            for m in (predicted & actual, predicted & ~actual, ~predicted & actual)
        )
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)
        ap = [r.ap for r in ranked]
        exact = (predicted == actual).all(1).sum().item()  # every label of a sample right
        micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)
        return {
            "loss": sums["loss"] / max(count * k, 1),  # per label and sample
            "map": sum(ap) / k,
            "micro_f1": micro.item(),
            "macro_f1": f1.mean().item(),
            "exact_match": exact / count if count else math.nan,
            "precision": (tp / (tp + fp).clamp(min=1)).tolist(),
            "recall": (tp / (tp + fn).clamp(min=1)).tolist(),
            "f1": f1.tolist(),
            "ap": ap,
            "threshold": list(self.thresholds),
            "count": int(count),
        }

    # >>> export
    # What predict.py writes and an exported artifact computes and promises.
    def head(self) -> nn.Module:
        return nn.Sigmoid()  # decode, inside the artifact

    def describe(self) -> dict:
        return {
            "shape": ["batch", self.num_outputs],
            "units": "a probability per label, in the order of `labels` (the sigmoid is "
            "inside); a label is predicted where its probability >= its threshold",
            "labels": self.label_names,
            "thresholds": list(self.thresholds),
        }
    # <<< export

    def columns(self) -> list[str]:
        return [
            "prediction",
            *(f"prob_{n}" for n in self.label_names),
            *(f"pred_{n}" for n in self.label_names),
        ]

    def rows(self, probabilities: torch.Tensor) -> list[list]:
        """predict.py's rows: the labels predicted (joined by "|"), every label's probability
        and its 0/1 decision."""
        decisions = self.decide(probabilities).tolist()
        return [
            [
                "|".join(n for n, d in zip(self.label_names, row, strict=True) if d),
                *(round(p, 6) for p in probs),
                *row,
            ]
            for probs, row in zip(probabilities.tolist(), decisions, strict=True)
        ]


def pos_weights(option, names: list[str], meta: dict) -> list[float] | None:
    """task.pos_weight per label, or None: `auto` is negatives / positives of the training
    split's labels (data meta: the same on resume and in evaluation)."""
    if option == "none":
        return None
    if option == "auto":
        positives, rows = meta.get("label_counts"), meta.get("label_rows")
        if positives is None or rows is None:
            raise ConfigError(
                "task.pos_weight=auto needs the training split's label counts, which this "
                "dataset does not provide (no label tensor y); give the weights as a list"
            )
        return [(rows - p) / p if p > 0 else 1.0 for p in positives]
    return in_order(option, names, "task.pos_weight", ("label", "labels"))
