"""Experiment trackers beside metrics.csv: Weights & Biases and MLflow, chosen by run.loggers.

Both are optional and imported only when chosen. They record locally by default, inside the
run folder, so nothing leaves the machine unless asked:

- wandb: offline, under <run folder>/wandb/ (`wandb sync <run folder>/wandb/offline-run-*`
  uploads it later). A WANDB_MODE you set (online, disabled) is used instead.
- mlflow: a file store at <run folder>/mlruns (`MLFLOW_ALLOW_FILE_STORE=true mlflow ui
  --backend-store-uri <that folder>`: MLflow 3 opens file stores only when told). An
  MLFLOW_TRACKING_URI you set (a server, sqlite:///mlflow.db) is used instead.

Each tracker's run id is saved in every checkpoint (`trackers` in the state), so a resumed
run keeps logging into the same tracker run; after a crash that left steps logged past the
checkpoint, a resume logs to a new tracker run instead (logger.py's _rewound). Only rank 0
opens trackers (see logger.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path

from ..config import flatten
from ..errors import ConfigError

OPTIONAL = ("wandb", "mlflow")  # run.loggers whose package is not a dependency of the project
# The experiment (MLflow) / project (wandb) when none is set: this package's name.
PROJECT = __package__.split(".")[0]


def check_installed(loggers) -> None:
    """Refuse, before anything is written, a tracker whose package is missing."""
    for name in loggers:
        if name in OPTIONAL and not _installed(name):
            raise ConfigError(
                f"run.loggers includes {name}, which is not installed: pip install {name} "
                f"(or leave {name} out of run.loggers)"
            )


def open_trackers(loggers, run_dir: Path, config: dict, ids: dict, branch=None) -> list:
    """The trackers of `loggers`, each resuming its run in `ids` (name -> run id) if any;
    `branch` ({"runs": ids, "step": step}): new runs continue those runs from that step."""
    kinds = {"wandb": WandbTracker, "mlflow": MlflowTracker}
    opened = []
    try:
        for name in loggers:
            if name in kinds:
                parent = (branch["runs"].get(name), branch["step"]) if branch else None
                opened.append(kinds[name](run_dir, config, ids.get(name), parent))
    except BaseException:
        for tracker in opened:  # one that fails to open leaves none of the others running
            tracker.close()
        raise
    return opened


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
            notes=_continues("wandb", parent),
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


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict, run_id: str | None, parent=None):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        # MLflow 3 keeps the file store in maintenance mode and refuses it unless told: it is
        # allowed here for the store this project chooses, never for one the user chose.
        allow = {} if uri else {"MLFLOW_ALLOW_FILE_STORE": "true"}
        uri = uri or (run_dir / "mlruns").resolve().as_uri()
        with _environ(allow):
            # A client, not mlflow's module-level active run: nothing global is changed.
            self.client = MlflowClient(tracking_uri=uri)
            run = self._resume(run_id, uri) if run_id else None
            if run is None:
                note = {"mlflow.note.content": _continues("MLflow", parent)} if parent else {}
                run = self.client.create_run(self._experiment(), run_name=run_dir.name, tags=note)
        self.id = run.info.run_id
        # MLflow refuses to change a logged param: a resume adds only new keys; the settings
        # in force are in config.yaml, and the changes are printed at resume.
        logged = run.data.params
        params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items() if k not in logged]
        for i in range(0, len(params), 100):  # at most 100 params per request
            self.client.log_batch(self.id, params=params[i : i + 100])

    def _resume(self, run_id: str, uri: str):
        """The run to continue, running again; None where this store lacks it (another
        MLFLOW_TRACKING_URI than before): a new run is started then."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            print(f"note: MLflow run {run_id} is not in {uri}; logging to a new run")
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run

    def _experiment(self) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found else self.client.create_experiment(name)

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()]
        self.client.log_batch(self.id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.id)


def _continues(tracker: str, parent) -> str | None:
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


@contextlib.contextmanager
def _environ(values: dict):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
