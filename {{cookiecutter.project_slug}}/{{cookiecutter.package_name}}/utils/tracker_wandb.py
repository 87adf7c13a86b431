"""Weights & Biases as an experiment tracker (run.loggers=wandb; utils/trackers.py).

Offline by default, under <run folder>/wandb/ (`wandb sync <run folder>/wandb/offline-run-*`
uploads it later); a WANDB_MODE you set (online, disabled) is used instead. Imported only
when a run logs to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .trackers import PROJECT, continues


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, config: dict, run_id: str | None, parent=None):
        import wandb

        # A new run after a crash (parent: the run and step it continues) is linked by name,
        # group and notes. wandb's fork_from / resume_from would copy or rewind the history,
        # but both are preview features that a server may refuse at upload.
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=run_dir.name,
            group=run_dir.name,
            notes=continues("wandb", parent),
            id=run_id,
            resume="allow" if run_id else None,
            dir=str(run_dir),
            mode=None if "WANDB_MODE" in os.environ else "offline",
            config=config,
            allow_val_change=True,  # a resume may change settings (train.epochs, train.lr)
            # console="off": wandb leaves stdout alone (tqdm's bar, the epoch lines).
            settings=wandb.Settings(console="off", quiet=True),
        )
        self.id = self.run.id

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
