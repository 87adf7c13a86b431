"""run.loggers: the list setting and its errors, and the optional trackers (wandb offline,
MLflow's local store) recording a run that a resume continues under the same run id."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit


def run_folder(overrides) -> Path:
    cfg = load_config(None, overrides)
    return Path(cfg.run.output_dir) / cfg.run.name


@pytest.mark.parametrize(
    ("value", "loggers"),
    [("csv,wandb", ["csv", "wandb"]), ("[tensorboard, mlflow]", ["tensorboard", "mlflow"])],
)
def test_trackers_are_loggers(value, loggers):
    assert load_config(None, [f"run.loggers={value}"]).run.loggers == loggers


def test_a_misspelt_tracker_names_the_closest_choice():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["run.loggers=[WandB]"])
    assert "got 'WandB' (did you mean 'wandb'?)" in str(err.value)


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def crash_then_resume(tiny, logger: str, monkeypatch) -> tuple[Path, str, int]:
    """Epoch 1; epoch 2 dies after logging its steps, before its checkpoint (as kill -9
    would); a resume replays epoch 2. Returns the run folder, the tracker run the resume
    logged to and the step resumed from."""
    first = [*tiny, f"run.loggers=csv,{logger}", "train.epochs=1"]
    fit(load_config(None, first))
    run = run_folder(first)
    resumed_from = checkpoint.load(run / "last.pt")["progress"]["step"]
    second = [*first, "train.epochs=2", "train.resume=auto"]

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash before the checkpoint")

    with monkeypatch.context() as patch:
        patch.setattr(RunFolder, "save", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            fit(load_config(None, second))
    fit(load_config(None, second))
    return run, checkpoint.load(run / "last.pt")["trackers"][logger], resumed_from


def replayed_steps_once(steps: list[int], resumed_from: int) -> bool:
    """The steps after `resumed_from` are the resume's: each once (4 steps/log, 16/epoch)."""
    return [s for s in steps if s > resumed_from] == [20, 24, 28, 32] and resumed_from == 16


def wandb_records(path: Path):
    """The records of an offline .wandb file (a 7-byte header, then LevelDB-log blocks of
    32 KiB: each chunk a 7-byte header of crc, length and kind; kinds 1 and 4 end a record)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, record = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        record, pos = record + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            record = b""
            yield parsed


def wandb_steps(run: Path, run_id: str, key: str) -> list[int]:
    """The steps at which `key` was logged to wandb run `run_id`, over all its attempts."""
    steps = []
    for path in sorted((run / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                row = {item.key or "/".join(item.nested_key): item.value_json for item in items}
                if key in row:
                    steps.append(json.loads(row["_step"]))
    return steps


@pytest.mark.slow
def test_wandb_resume_after_steps_logged_past_the_checkpoint_logs_them_once(
    tiny, monkeypatch, capsys
):
    pytest.importorskip("wandb", reason="wandb is optional: pip install wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run, resumed, step = crash_then_resume(tiny, "wandb", monkeypatch)
    steps = wandb_steps(run, resumed, "train/loss")
    assert replayed_steps_once(steps, step), steps  # none dropped, no abandoned one kept
    assert "logging the resume to new tracker runs" in capsys.readouterr().out


@pytest.mark.slow
def test_mlflow_resume_after_steps_logged_past_the_checkpoint_logs_them_once(
    tiny, monkeypatch, capsys
):
    pytest.importorskip("mlflow", reason="mlflow is optional: pip install mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run, resumed, step = crash_then_resume(tiny, "mlflow", monkeypatch)
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    steps = sorted(m.step for m in client.get_metric_history(resumed, "train/loss"))
    assert replayed_steps_once(steps, step), steps
