"""run.loggers: the list setting and its errors, and the optional trackers (wandb offline,
MLflow's local store) recording a run that a resume continues under the same run id."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit


def run_folder(overrides) -> Path:
    cfg = load_config(None, overrides)
    return Path(cfg.run.output_dir) / cfg.run.name


@pytest.mark.parametrize(
    ("value", "loggers"),
    [
        ("csv,wandb", ["csv", "wandb"]),  # the shell-friendly form
        ("[tensorboard, mlflow]", ["tensorboard", "mlflow"]),
        ("[csv, csv]", ["csv"]),
        ("", []),
    ],
)
def test_loggers_read_as_a_list(value, loggers):
    assert load_config(None, [f"run.loggers={value}"]).run.loggers == loggers


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "csv,tensorbord",
            "run.loggers[1] must be one of csv, tensorboard, wandb, mlflow, "
            "got 'tensorbord' (did you mean 'tensorboard'?)",
        ),  # fmt: skip
        ("[WandB]", "got 'WandB' (did you mean 'wandb'?)"),
        ("3", "run.loggers expects a list such as [a, b] or a,b; got 3 (int)"),
        ("{a: 1}", "run.loggers expects a list"),
    ],
)
def test_bad_loggers_name_the_item_and_the_closest_choice(value, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"run.loggers={value}"])
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_not_installed_is_one_error_before_anything_is_written(tiny, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what a missing package looks like
    overrides = [*tiny, f"run.loggers=csv,{name}"]
    with pytest.raises(ConfigError, match=f"pip install {name} "):
        fit(load_config(None, overrides))
    assert not run_folder(overrides).exists()


def stop_then_resume(tiny, logger: str) -> tuple[Path, list[str]]:
    """One epoch, then a resume for the second; returns the run folder and both runs' ids."""
    first = [*tiny, f"run.loggers=csv,{logger}", "train.epochs=1"]
    fit(load_config(None, first))
    run = run_folder(first)
    ids = [checkpoint.load(run / "last.pt")["trackers"][logger]]
    fit(load_config(None, [*first, "train.epochs=2", "train.resume=auto"]))
    ids.append(checkpoint.load(run / "last.pt")["trackers"][logger])
    return run, ids


def test_wandb_records_offline_in_the_run_folder_and_a_resume_continues_the_run(tiny, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional: pip install wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default: offline
    run, (first, second) = stop_then_resume(tiny, "wandb")
    assert first == second
    records = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [path.name for path in records] == [f"run-{first}.wandb"] * 2  # one per attempt
    data = [path.read_bytes() for path in records]
    assert all(b"val/loss" in d and b"train/loss" in d for d in data)
    assert b"log_every" in data[0]  # the config, as the run's hyperparameters


def test_mlflow_records_in_a_local_store_and_a_resume_continues_the_run(tiny, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is optional: pip install mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: <run>/mlruns
    run, (first, second) = stop_then_resume(tiny, "mlflow")
    assert first == second
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks it for file stores
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert [r.info.run_id for r in client.search_runs(experiments)] == [first]
    steps = [m.step for m in client.get_metric_history(first, "val/loss")]
    per_epoch = checkpoint.load(run / "last.pt")["progress"]["step"] // 2
    assert steps == [per_epoch, 2 * per_epoch]  # one value per epoch, across the resume
    recorded = client.get_run(first)
    assert recorded.data.params["train.epochs"] == "1"  # as logged at start; resumes add keys
    assert recorded.data.params["run.loggers"] == "['csv', 'mlflow']"
    assert recorded.info.status == "FINISHED"


def test_mlflow_starts_a_new_run_where_the_store_lacks_the_saved_one(
    tiny, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("mlflow", reason="mlflow is optional: pip install mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = [*tiny, "run.loggers=csv,mlflow", "train.max_steps=2"]
    fit(load_config(None, first))
    run = run_folder(first)
    saved = checkpoint.load(run / "last.pt")["trackers"]["mlflow"]
    # The resume logs to another store, one the user chose.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "elsewhere").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    fit(load_config(None, [*first, "train.max_steps=4", "train.resume=auto"]))
    assert checkpoint.load(run / "last.pt")["trackers"]["mlflow"] != saved
    assert f"note: MLflow run {saved} is not in " in capsys.readouterr().out
