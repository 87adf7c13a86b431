"""MLflow as an experiment tracker (run.loggers=mlflow; utils/trackers.py).

A file store at <run folder>/mlruns by default (`MLFLOW_ALLOW_FILE_STORE=true mlflow ui
--backend-store-uri <that folder>`: MLflow 3 opens file stores only when told); an
MLFLOW_TRACKING_URI you set (a server, sqlite:///mlflow.db) is used instead. Imported only
when a run logs to it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ..config import flatten
from .trackers import PROJECT, continues


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
                note = {"mlflow.note.content": continues("MLflow", parent)} if parent else {}
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
