"""Task registry: a task owns the loss, the validation metrics and which way each improves.

The training loop and `evaluate` call the task and name no loss. To add a task: write
tasks/<name>.py with a class like those below, then add one line to TASKS. A task has
- `Options`: a dataclass of its settings (the `task:` section of the config, beside `name`);
- `targets`: what it needs from the data: "class" (int64 ids), "value" (floats) or "tokens";
- `metrics`: {name: "max" | "min"}, the first one picking best.pt by default;
- `__init__(opts, data)`: reads the sizes it needs from the training data (e.g. num_classes)
  and sets `num_outputs`, the size of the model's last dimension;
- `loss(output, y)`: the mean loss of a batch;
- `sums(output, y)`: a 1-D float tensor of sums and counts over the batch. Sums add up
  across batches and ranks (one all-reduce), so metrics are exact on any number of GPUs;
- `summarise(sums)`: the metrics dict from the totals, "loss" and "count" included.
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


def build_task(cfg, data):
    """The task of cfg.task (a TaskConfig) for this training data."""
    return TASKS[cfg.name](cfg.options, data)
