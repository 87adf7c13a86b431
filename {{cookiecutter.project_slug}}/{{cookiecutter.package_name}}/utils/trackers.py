"""Experiment trackers beside metrics.csv, chosen by run.loggers: a registry of their classes,
each imported only when a run logs to it, and the two things the trainer asks of them.

A tracker is a class with `name`, `id` (its run's id), `log(values, step)` and `close()`,
built as Tracker(run_dir, config, run_id, parent). Its run id is saved in every checkpoint
(`trackers` in the state), so a resumed run keeps logging into the same tracker run; after a
crash that left steps logged past the checkpoint, a resume logs to a new tracker run instead
(`parent`: the run and step it continues; logger.py's _rewound). Only rank 0 opens trackers
(see logger.py). Adding one is a module of utils/ and a line in TRACKERS (config/schema.py
reads the names from it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import ConfigError

# run.loggers name -> (module of utils/, class), imported only when a run logs to it. The
# name is also the package it needs (not a dependency of the project).
TRACKERS: dict[str, tuple[str, str]] = {}
# >>> trackers
TRACKERS["wandb"] = ("tracker_wandb", "WandbTracker")
TRACKERS["mlflow"] = ("tracker_mlflow", "MlflowTracker")
# <<< trackers
# The experiment or project a tracker files runs under when none is set: this package's name.
PROJECT = __package__.split(".")[0]


def check_installed(loggers) -> None:
    """Refuse, before anything is written, a tracker whose package is missing."""
    for name in loggers:
        if name in TRACKERS and not _installed(name):
            raise ConfigError(
                f"run.loggers includes {name}, which is not installed: pip install {name} "
                f"(or leave {name} out of run.loggers)"
            )


def open_trackers(loggers, run_dir: Path, config: dict, ids: dict, branch=None) -> list:
    """The trackers of `loggers`, each resuming its run in `ids` (name -> run id) if any;
    `branch` ({"runs": ids, "step": step}): new runs continue those runs from that step."""
    opened = []
    try:
        for name in loggers:
            if name in TRACKERS:
                module, cls = TRACKERS[name]
                kind = getattr(importlib.import_module(f"{__package__}.{module}"), cls)
                parent = (branch["runs"].get(name), branch["step"]) if branch else None
                opened.append(kind(run_dir, config, ids.get(name), parent))
    except BaseException:
        for tracker in opened:  # one that fails to open leaves none of the others running
            tracker.close()
        raise
    return opened


def continues(tracker: str, parent) -> str | None:
    """The note of a tracker run that replaces `parent` (run id, step) after a crash."""
    if parent is None:
        return None
    return (
        f"Continues {tracker} run {parent[0]} from step {parent[1]}; its steps after that were "
        "logged before a crash and replaced by this run's."
    )


def _installed(name: str) -> bool:
    if name in sys.modules:  # None there means "import refused" (tests simulate a missing one)
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None
