"""Task registry: a task owns the loss, the validation metrics and which way each improves.

The training loop and `evaluate` call the task and name no loss. To add a task: write
tasks/<name>.py with a class like those below, then add one line to TASKS. A task has
- `Options`: a dataclass of its settings (the `task:` section of the config, beside `name`);
- `targets`: what it needs from the data: "class" (int64 ids), "value" (floats) or "tokens";
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
- `summarise(sums)`: the metrics dict from the totals (floats, or lists for vectors), read by
  name; "loss" and "count" included.
A different loss is an option of the task (e.g. regression's `loss: huber`), not a new task.
"""

from __future__ import annotations

from .classification import Classification
from .language_model import LanguageModel
from .regression import Regression

TASKS = {
    "classification": Classification,
    "regression": Regression,
    "language_model": LanguageModel,
}


def build_task(cfg, data, meta: dict | None = None):
    """The task of cfg.task (a TaskConfig) for this training data and its data meta."""
    return TASKS[cfg.name](cfg.options, data, meta or {})
