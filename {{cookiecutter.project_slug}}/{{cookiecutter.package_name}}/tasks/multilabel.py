"""Multi-label classification: each sample carries any number of L labels, a 0/1 target
vector (N, L) ("a photo of a beach and a dog"; a ticket that is both "billing" and
"urgent"). The model gives one logit per label (N, L); the loss is binary cross-entropy,
each label's positives optionally weighted (`task.pos_weight`); `decode` is the sigmoid, so
predictions give a probability per label.

Metrics, each validation, from float64 sums that add up over batches and ranks: per label
precision, recall, F1 and average precision (AP), their micro- and macro-F1, the mean AP
(map) and the exact match ratio (every label of a sample right). AP comes from the per-label
score histogram of tasks/ranking.py (within 1e-3 of scikit-learn, stated there); precision,
recall and F1 from the decisions' counts (read off the histogram where every threshold is a
bin edge: 0.5 and any tuned one). A label is predicted when its probability reaches
its threshold: `task.threshold` for all, or `auto`, each label's F1-best threshold on the
validation split (a histogram bin edge, so F1 there is exact), saved in the checkpoint's
data meta and used by evaluate.py and predict.py (and an export's JSON). With `auto`, the exact  # feature: export
data meta and used by evaluate.py and predict.py. With `auto`, the exact  # feature: !export
match ratio is counted at the thresholds in force while the split is scored (the previous
validation's; the others are tuned on it first), since it needs each sample's decisions.
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
        probabilities = logits.sigmoid()
        predicted, actual = self.decide(probabilities).bool(), truth > 0.5
        sums = {
            "loss": F.binary_cross_entropy_with_logits(logits, truth, reduction="sum").to(wide),
            "count": torch.full((), len(y), dtype=wide, device=y.device),
            # (L, 2, BINS), flat: summarise reads a flat list back ~5x faster than nested ones
            "scores": ranking.histogram(probabilities, truth, wide).flatten(),
            "exact": (predicted == actual).all(1).sum().to(wide),
        }
        if not self._from_scores():  # a threshold between bin edges: count the decisions
            sums["tp"] = (predicted & actual).sum(0).to(wide)
            sums["fp"] = (predicted & ~actual).sum(0).to(wide)
            sums["fn"] = (~predicted & actual).sum(0).to(wide)
        return sums

    def _from_scores(self) -> bool:
        """Whether the histogram gives each label's counts exactly: every threshold on a bin
        edge (0.5, any tuned one), so no counting per batch is needed."""
        return self.tune or all(float(t * ranking.BINS).is_integer() for t in self.thresholds)

    def summarise(self, sums: dict) -> dict:
        count = sums["count"]
        scores = torch.tensor(sums["scores"], dtype=torch.float64, device="cpu")
        scores = scores.view(self.num_outputs, 2, ranking.BINS)
        if self.tune:  # each label's F1-best bin edge; its counts there are exact
            self.thresholds = ranking.best_threshold(scores)[0]
            self.meta["tuned"] = {"thresholds": self.thresholds}  # saved with the data meta
        if "tp" not in sums:  # thresholds on bin edges: the counts from the histogram, exact
            cells = ranking.confusion_at(scores, self.thresholds)  # [label, true, predicted]
            tp, fp, fn = cells[:, 1, 1], cells[:, 0, 1], cells[:, 1, 0]
        else:
            tp, fp, fn = (torch.tensor(sums[k], dtype=torch.float64) for k in ("tp", "fp", "fn"))
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)
        present = (tp + fp + fn) > 0  # as classification: labels seen in targets or decisions
        ap = torch.tensor(ranking.average_precision(scores), dtype=torch.float64)
        with_positives = ~ap.isnan()
        micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)
        return {
            "loss": sums["loss"] / max(count * self.num_outputs, 1),  # per label and sample
            "map": ap[with_positives].mean().item() if with_positives.any() else math.nan,
            "micro_f1": micro.item(),
            "macro_f1": f1[present].mean().item() if present.any() else math.nan,
            "exact_match": sums["exact"] / count if count else math.nan,
            "precision": (tp / (tp + fp).clamp(min=1)).tolist(),
            "recall": (tp / (tp + fn).clamp(min=1)).tolist(),
            "f1": f1.tolist(),
            "ap": ap.tolist(),
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
