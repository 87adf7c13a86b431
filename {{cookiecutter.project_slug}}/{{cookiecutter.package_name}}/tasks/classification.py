"""Classification: cross-entropy (optionally label-smoothed, optionally class-weighted) on
logits (N, K); accuracy, per-class precision / recall / F1, macro-F1, balanced accuracy and,
for two classes, AUROC and average precision, a decision threshold tuned on validation.

Every metric is exact: the K x K confusion matrix of the decisions is a float64 sum over
batches and ranks; for two classes, the positive class's probability and the target of each
sample are gathered instead, and the confusion, AUROC, AP and a tuned threshold come from
them (tasks/ranking.py). The positive class of two is the second (classes sort by name:
"no", "yes"; 0, 1), decided by `probability >= task.threshold`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..utils.device import sums_dtype


@dataclass
class Options:
    label_smoothing: float = 0.0  # spreads this much target mass over all classes (0 = off)
    # Loss weight per class: none | auto (inverse class frequency of the training split) |
    # [w0, w1, ...] in class order | {class name: weight}. The reported val loss is unweighted.
    class_weights: list[float] | dict[str, float] | str = "none"
    # Two classes: predict the second when its probability >= threshold; auto: the threshold
    # maximising F1 on the validation split, saved in each checkpoint (evaluate and predict).
    threshold: float | str = 0.5

    def checks(self):
        return [
            ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
            (
                "class_weights",
                weights_ok(self.class_weights, zero_ok=True),
                "none, auto, a list of weights >= 0 or a mapping {class name: weight}",
            ),
            threshold_check(self.threshold),
        ]


def weights_ok(weights, zero_ok: bool) -> bool:
    """none, auto, or a non-empty list / mapping of finite weights > 0 (>= 0 with `zero_ok`,
    not all zero): task.class_weights, multi-label's task.pos_weight.""" # feature: multilabel
    not all zero): task.class_weights.""" # feature: !multilabel
    if isinstance(weights, str):
        return weights in ("none", "auto")
    values = list(weights.values()) if isinstance(weights, dict) else list(weights)
    fits = all(math.isfinite(w) and (w >= 0 if zero_ok else w > 0) for w in values)
    return bool(values) and fits and any(w > 0 for w in values)


def threshold_check(threshold) -> tuple[str, bool, str]:
    """Options.checks' entry for a task.threshold: a probability, or auto (tuned)."""
    ok = threshold == "auto" or (not isinstance(threshold, str) and 0 <= threshold <= 1)
    return ("threshold", ok, "a probability in [0, 1] or auto")


class Classification:
    Options = Options
    targets = "class"
    gathered = ("scores",)  # sums kept per sample (two classes): concatenated, not added
    metrics = {
        "acc": "max",
        "loss": "min",
        "macro_f1": "max",
        "balanced_acc": "max",
        "auroc": "max",  # two classes only
        "ap": "max",  # two classes only: average precision (area under precision-recall)
        "precision": "max",
        "recall": "max",
        "f1": "max",
    }
    vector_metrics = ("precision", "recall", "f1")  # per class: f1/<class name>

    def __init__(self, opts: Options, data, meta: dict | None = None):
        self.label_smoothing = opts.label_smoothing
        self.num_outputs = k = getattr(data, "num_classes", None)
        if not self.num_outputs:
            found = "values (floats)" if getattr(data, "num_targets", None) else "no class ids"
            raise ConfigError(
                f"task.name=classification needs class ids, but the dataset's targets are "
                f"{found}; use task.name=regression, or convert the labels to class ids "
                "(e.g. y.long())"
            )
        self.meta = meta if meta is not None else {}
        names = self.meta.get("classes") or getattr(data, "classes", None)
        self.label_names = [str(c) for c in names] if names else [str(i) for i in range(k)]
        if k != 2:
            self.metrics = {m: d for m, d in self.metrics.items() if m not in ("auroc", "ap")}
            if opts.threshold != 0.5:
                raise ConfigError(
                    f"task.threshold={opts.threshold} decides between two classes, but the data "
                    f"has {k}; drop it (the most probable class is predicted)"
                )
        self.weights = class_weights(opts.class_weights, self.label_names, self.meta)
        # The validation of a run with threshold=auto tunes it; evaluate scores with the
        # checkpoint's (tools/evaluate.py sets tune False), the other tools read it.
        self.tune = opts.threshold == "auto"
        saved = self.meta.get("tuned", {}).get("threshold")
        self.threshold = saved if self.tune and saved is not None else _fixed(opts.threshold)
        self.note = None  # one line about the last tuning (too few positives), or None
        self._weight_copies = {}

    def _weights_on(self, device: torch.device) -> torch.Tensor | None:
        if self.weights is None:
            return None
        if device not in self._weight_copies:  # once: a copy per step would wait for the GPU
            self._weight_copies[device] = self.weights.to(device)
        return self._weight_copies[device]

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        weight = self._weights_on(output.device)
        if weight is None:
            return F.cross_entropy(output, y, label_smoothing=self.label_smoothing)
        # Each sample's loss times its class's weight, averaged over the batch's samples (as
        # Keras' class_weight), not over its weights' sum as torch's `weight=` mean does:
        # that normaliser differs per rank and micro-batch, so 2 ranks or accumulation
        # would not take the steps one process with the whole batch takes.
        weighted = F.cross_entropy(
            output, y, weight=weight.to(output.dtype), label_smoothing=self.label_smoothing,
            reduction="none",
        )  # fmt: skip
        return weighted.sum() / len(y)

    def decode(self, output: torch.Tensor) -> torch.Tensor:
        return output  # logits

    def decide(self, probabilities: torch.Tensor) -> torch.Tensor:
        """Class ids (N,) from probabilities (N, K): for two classes the second where its
        probability reaches the threshold, else the most probable."""
        if self.num_outputs == 2:
            return self.positive(probabilities[:, 1])
        return probabilities.argmax(1)

    def positive(self, scores: torch.Tensor) -> torch.Tensor:
        """Two classes: 1 where the second class's probability (float32) >= the threshold."""
        return (scores.float() >= self.threshold).long()

    def sums(self, output: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        # The reported loss is the plain cross-entropy, comparable across label_smoothing and
        # class_weights. Per batch in float32; float64 sums add up over batches and ranks.
        wide, k = sums_dtype(y.device), self.num_outputs
        logits = output.float()
        probabilities = logits.softmax(1)
        sums = {
            "loss": F.cross_entropy(logits, y, reduction="sum").to(wide),
            "count": torch.full((), len(y), dtype=wide, device=y.device),
        }
        if k == 2:  # (N, 2): each sample's score and target; summarise decides on them
            sums["scores"] = torch.stack([probabilities[:, 1], y.float()], 1)
        else:
            cells = torch.bincount(y * k + self.decide(probabilities), minlength=k * k)
            sums["confusion"] = cells.to(wide).view(k, k)  # [true class, predicted class]
        return sums

    def summarise(self, sums: dict) -> dict:
        count, rows = sums["count"], sums.get("scores")
        metrics = {"loss": sums["loss"] / count}
        if rows is None:
            confusion = torch.tensor(sums["confusion"], dtype=torch.float64, device="cpu")
        else:
            from . import ranking  # two classes: their scores ranked (more classes skip it)

            scores, targets = rows[:, 0], rows[:, 1].long()
            ranked = ranking.rank(scores, targets)
            if self.tune:  # on this split; evaluate.py and the test split score with it frozen
                self.threshold, positives = ranked.threshold, int(targets.sum())
                self.meta["tuned"] = {"threshold": self.threshold, "positives": positives}
                self.note = ranking.tuning_note("task.threshold", [positives])
            cells = torch.bincount(targets * 2 + self.positive(scores), minlength=4)
            confusion = cells.to(torch.float64).view(2, 2)
            metrics |= {"auroc": ranked.auroc, "ap": ranked.ap, "threshold": self.threshold}
        metrics |= from_confusion(confusion)
        order = ["loss", *self.metrics, "threshold"]  # as the console and summary show them
        return {**{m: metrics[m] for m in order if m in metrics}, "count": int(count)}

    # >>> export
    # What predict.py writes and an exported artifact computes (logits: no head) and promises.
    def head(self) -> None:
        return None

    def describe(self) -> dict:
        return {
            "shape": ["batch", self.num_outputs],
            "units": "logits per class, in the order of `classes` (softmax gives probabilities)",
            "classes": self.label_names,
        }
    # <<< export

    def columns(self) -> list[str]:
        return ["prediction", "probability", *(f"prob_{c}" for c in self.label_names)]

    def rows(self, logits: torch.Tensor) -> list[list]:
        """predict.py's rows: the class decided (with two, by task.threshold), its
        probability and every class's."""
        probabilities = logits.float().softmax(-1)
        index = self.decide(probabilities)
        return [
            [self.label_names[i], round(p[i], 6), *(round(q, 6) for q in p)]
            for i, p in zip(index.tolist(), probabilities.tolist(), strict=True)
        ]


def from_confusion(confusion: torch.Tensor) -> dict:
    """acc, per-class precision / recall / F1, macro-F1 and balanced accuracy from a K x K
    confusion matrix [true, predicted], as scikit-learn's default calls compute them: a
    ratio without a denominator is 0 (zero_division=0); macro averages (macro_f1, and the
    report's macro_precision and macro_recall) take the classes present in the targets or
    the decisions, balanced accuracy the recall of the classes present in the targets."""
    hits, support, predicted = confusion.diagonal(), confusion.sum(1), confusion.sum(0)
    precision = hits / predicted.clamp(min=1)
    recall = hits / support.clamp(min=1)
    f1 = 2 * hits / (support + predicted).clamp(min=1)
    present = (support + predicted) > 0
    return {
        "acc": (hits.sum() / confusion.sum().clamp(min=1)).item(),
        "macro_f1": f1[present].mean().item() if present.any() else math.nan,
        "macro_precision": precision[present].mean().item() if present.any() else math.nan,
        "macro_recall": recall[present].mean().item() if present.any() else math.nan,
        "balanced_acc": recall[support > 0].mean().item() if (support > 0).any() else math.nan,
        "precision": precision.tolist(),
        "recall": recall.tolist(),
        "f1": f1.tolist(),
    }


def class_weights(option, names: list[str], meta: dict) -> torch.Tensor | None:
    """task.class_weights as a (K,) float32 tensor, or None: `auto` from the training split's
    class counts (data meta: the same on resume and in evaluation), N / (K * count)."""
    k = len(names)
    if option == "none":
        return None
    if option == "auto":
        counts = meta.get("class_counts")
        if counts is None:
            raise ConfigError(
                "task.class_weights=auto needs the training split's class counts, which this "
                "dataset does not provide (no label tensor y); give the weights as a list"
            )
        counts = torch.tensor(counts, dtype=torch.float64, device="cpu")
        weights = counts.sum() / (k * counts.clamp(min=1))
        return weights.where(counts > 0, 0.0).float()
    weights = in_order(option, names, "task.class_weights", ("class", "classes"))
    return torch.tensor(weights, dtype=torch.float32, device="cpu")


def in_order(option, names: list[str], key: str, noun: tuple[str, str]) -> list[float]:
    """A list of weights, or a mapping {name: weight}, as one weight per name in the order of
    `names`; one line when they do not fit. `noun`: what a name is, singular and plural."""
    one, many = noun
    if isinstance(option, dict):
        unknown = [n for n in option if n not in names]
        missing = [n for n in names if n not in option]
        if unknown or missing:
            wrong = f"{unknown} are not {many}" if unknown else f"{missing} have no weight"
            raise ConfigError(f"{key}: {wrong}; give a weight for each {one} of {names}")
        option = [option[n] for n in names]
    if len(option) != len(names):
        raise ConfigError(
            f"{key} has {len(option)} weights for the {len(names)} {many} {names}; give one "
            f"per {one}, in this order, or a mapping ({one} name: weight)"
        )
    return [float(w) for w in option]


def _fixed(threshold) -> float:
    return 0.5 if threshold == "auto" else float(threshold)  # auto before any validation
