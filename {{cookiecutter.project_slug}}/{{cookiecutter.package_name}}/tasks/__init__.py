"""Task registry: a task owns the loss, the validation metrics and which way each improves.

The training loop and `evaluate` call the task and name no loss. To add a task: write
tasks/<name>.py with a class like those below, then add one line to TASKS. A task has
- `Options`: a dataclass of its settings (the `task:` section of the config, beside `name`);
- `targets`: what it needs from the data: "class" (int64 ids), "value" (floats), "labels"
  (a float 0/1 vector per sample) or "tokens";
- `metrics`: {name: "max" | "min"}, the first one picking best.pt by default;
- `__init__(opts, data, meta)`: reads the sizes it needs from the training data (e.g.
  num_classes) and sets `num_outputs`, the size of the model's last dimension; `meta` is the
  data meta (a checkpoint's when evaluating), e.g. the regression targets' mean and std;
- `loss(output, y)`: the mean loss of a batch, in the units the model learns;
- `decode(output)`: the model's output in the targets' own units (regression maps its
  standardised outputs back; the others return it as it is), for metrics and prediction;
- `sums(output, y)`: a dict of named float64 tensors on y's device (scalars, or per-target
  vectors) summed over the batch. The caller adds them per name over batches, then over
  ranks in one all-reduce (distributed.all_reduce_sums), so metrics are exact on any number
  of GPUs. A new metric is a new key here and in `summarise`;
- `gathered` (optional): names of `sums` entries that hold one row per sample, a tensor
  (N, ...) of any dtype, for metrics that need every sample (AUROC ranks them all): these are
  concatenated over batches and ranks instead of added;
- `summarise(sums)`: the metrics dict from the totals (given as floats, or lists for
  vectors; a gathered entry as one CPU tensor of the split's rows in no particular order),
  read by name; "loss" and "count" included. A metric may be a scalar or a vector
  with one value per class / label (a list or a 1-D tensor): name it in `vector_metrics`,
  and the records hold it per entry, `<name>/<label>` (utils/metrics.flatten), with the
  names of `label_names` (a list of str, optional; indices without it). An entry, say
  `f1/cat`, works as train.best_metric, with its vector's direction.
- `tune` (optional): whether validation tunes the task's decisions (classification's
  task.threshold=auto); a task that tunes records them as meta["tuned"] in the data meta it
  was given, which every checkpoint saves; `frozen_task` builds a task with `tune = False`
  from a checkpoint, which scores any other split (evaluate.py, the end-of-run test score).
  `note` (optional): one line about the last tuning, printed once by the run (too few
  positives to tune on), or None.
# >>> export
- `head()`, `describe()` (optional): `decode` as a module for the exported artifact (None:
  the outputs as they are) and what the artifact's output is (its JSON's "output": shape,
  units, names); without them the artifact applies `decode` and states the shape only;
# <<< export
- `columns()`, `rows(decoded)` (optional): predict.py's CSV columns and its rows for a batch
  of decoded outputs; without them it writes the decoded values.
A different loss is an option of the task (e.g. regression's `loss: huber`), not a new task.
`check_task` (tasks/protocol.py) tries every method on a real batch before a run writes
anything, so a task returning the wrong kind or shape is one line naming the method.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

from ..errors import ConfigError
from ..registry import Registry
from .protocol import check_task

__all__ = ["TASKS", "build_task", "check_metric", "check_task", "frozen_task", "metric_names"]

TASKS = Registry(
    __name__,
    classification=".classification:Classification",
    regression=".regression:Regression",
    language_model=".language_model:LanguageModel",  # feature: text
    multilabel=".multilabel:MultiLabel",  # feature: multilabel
)


def build_task(cfg, data, meta: dict | None = None, best: tuple[str, str] | None = None):
    """The task of cfg.task (a TaskConfig) for this training data and its data meta;
    `best` (Config.best()): refused unless the task reports that metric on this data."""
    task = TASKS[cfg.name](cfg.options, data, meta if meta is not None else {})
    if best is not None:
        check_metric(best[0], "train.best_metric", task)
    return task


# What each kind of targets calls the model's output size, as a dataset states it.
SIZES = {
    "class": "num_classes",
    "value": "num_targets",
    "labels": "num_labels",
    "tokens": "vocab_size",
}


def frozen_task(cfg, num_outputs: int, meta: dict):
    """The task of a checkpoint (cfg: its TaskConfig, its output size, its data meta), with
    the decisions it tuned on validation frozen: every split but the validation that tunes
    them is scored by it (evaluate.py, the end-of-run test score, predict.py), never retuned
    on the split it scores."""
    size = {SIZES[TASKS[cfg.name].targets]: num_outputs}
    task = build_task(cfg, SimpleNamespace(**size), copy.deepcopy(meta))
    task.tune = False
    return task


def metric_names(task) -> list[str]:
    """The flat names of the metrics the task reports: its scalars, and each vector's
    entries as `<name>/<label>` (its label_names, else indices; its num_outputs long)."""
    vectors = getattr(task, "vector_metrics", ())
    labels = getattr(task, "label_names", None) or range(task.num_outputs)
    names = []
    for name in getattr(task, "metrics", {}):
        names += [f"{name}/{label}" for label in labels] if name in vectors else [name]
    return names


def check_metric(metric: str, option: str, task) -> None:
    """Refuse, before anything is written, a metric this task does not report on this data
    (a class name that is not one, auroc of more than two classes)."""
    names = metric_names(task)
    if metric not in names:
        raise ConfigError(
            f"{option}={metric} is not reported for this data; choose one of "
            f"{', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
        )
