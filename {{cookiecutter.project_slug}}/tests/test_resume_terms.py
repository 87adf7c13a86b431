"""A resume honours its terms or refuses them: another run's checkpoint continues only into a
new run, best.pt keeps the metric it was chosen by, a run folder removed under a running run
is not written again, a kill between a checkpoint and its metrics row loses no row, and a
mid-epoch position beyond the data is refused."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, run_script, stop_after, tiny_with

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import RunFolder, resume
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import CheckpointError, ConfigError
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.trainer import fit


def run_dir(tiny, name="default") -> Path:
    return Path(load_config(None, tiny).run.output_dir) / name


def snapshot(folder: Path) -> dict:
    """Every file below `folder` (the lock file aside) and its bytes."""
    return {
        p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def epochs_logged(folder: Path) -> list[str]:
    with (folder / "metrics.csv").open(newline="") as f:
        return [row["epoch"] for row in csv.DictReader(f)]


# ---- another run's checkpoint ------------------------------------------------------------


def test_another_runs_checkpoint_is_refused_over_an_existing_run(tiny, capsys):
    """It would replace the run's checkpoints with another lineage and prune its own."""
    fit(load_config(None, [*tiny, "run.name=mine", "train.max_steps=2"]))
    fit(load_config(None, [*tiny, "run.name=other", "train.max_steps=3"]))
    before = snapshot(run_dir(tiny, "mine"))
    capsys.readouterr()
    other = run_dir(tiny, "other") / "last.pt"
    code = train_main([*tiny, "run.name=mine", f"train.resume={other}", "train.max_steps=5"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "run 'mine' already exists" in err and "not one of its checkpoints" in err
    assert "as a new run with run.name=<new name>" in err and "train.resume=auto" in err
    assert snapshot(run_dir(tiny, "mine")) == before


def test_a_copy_of_the_runs_own_checkpoint_still_resumes_it(tiny, tmp_path):
    """A file kept elsewhere whose settings name this run is this run's (a backup)."""
    fit(load_config(None, [*tiny, "train.max_steps=2"]))
    backup = tmp_path / "backup.pt"
    shutil.copyfile(run_dir(tiny) / "last.pt", backup)
    fit(load_config(None, [*tiny, "train.max_steps=3", "train.resume=auto"]))
    again = fit(load_config(None, [*tiny, "train.max_steps=4", f"train.resume={backup}"]))
    assert again["step"] == 4


@pytest.mark.slow
def test_another_runs_checkpoint_continues_as_a_new_run(tiny, capsys):
    """The new run: every training state of the checkpoint, its own records (metrics.csv from
    the resumed epoch on, config.yaml, runs.csv), its own best.pt; the other run untouched."""
    fit(load_config(None, [*tiny, "run.name=other", "train.epochs=2", "train.lr=1e-3"]))
    other = run_dir(tiny, "other")
    before = snapshot(other)
    source = sorted(other.glob("step-*.pt"))[0]  # the end of epoch 1
    forked = [*tiny, "run.name=fork", f"train.resume={source}", "train.epochs=3"]
    result = fit(load_config(None, forked))
    out = capsys.readouterr().out
    assert "another run's checkpoint, continued as the new run 'fork'" in out
    assert "run.name other -> fork" in out and result["step"] == 48
    fork = run_dir(tiny, "fork")
    assert epochs_logged(fork) == ["2", "3"]
    config = yaml.safe_load((fork / "config.yaml").read_text())
    assert config["run"]["name"] == "fork" and config["train"]["resume"] == str(source)
    best = checkpoint.load(fork / "best.pt")["progress"]
    assert best["best_epoch"] in (2, 3) and result["best"] == best["best"]
    assert snapshot(other) == before
    runs = list(csv.DictReader((fork.parent / "runs.csv").open()))
    assert [(r["run"], r["epochs"]) for r in runs] == [("other", "2"), ("fork", "3")]
    # The new run is now a run of its own: the same command would replace it; auto continues.
    assert train_main(forked[:-1] + ["train.epochs=4"]) == 2
    auto = [*tiny, "run.name=fork", "train.resume=auto", "train.epochs=4"]
    assert fit(load_config(None, auto))["epoch"] == 4
    assert epochs_logged(fork) == ["2", "3", "4"]


# ---- the metric that chose best.pt -------------------------------------------------------


def test_another_best_metric_on_resume_is_refused(tiny):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    before = snapshot(run_dir(tiny))
    with pytest.raises(ConfigError, match=r"pick val loss \(min\) now.*of val acc \(max\).*"
                       r"as a new run that picks its own best: run.name=<new name>"):  # fmt: skip
        fit(load_config(None, [*tiny, "train.resume=auto", "train.best_metric=loss"]))
    assert snapshot(run_dir(tiny)) == before


@pytest.mark.parametrize(
    ("saved", "now", "refused"),
    [
        ({}, ["train.best_metric=acc"], False),  # auto is acc for classification
        ({}, ["train.best_metric=acc", "train.best_mode=max"], False),
        ({"best_metric": "loss"}, ["train.best_metric=loss", "train.best_mode=min"], False),
        ({"best_metric": "loss"}, [], True),
        ({}, ["train.best_metric=loss"], True),
        ({"best_metric": "acc", "best_mode": "max"}, ["train.best_metric=loss"], True),
    ],
)
def test_best_terms_are_compared_as_resolved(saved, now, refused):
    state = {"config": {"train": saved}}
    cfg = load_config(None, now)
    if refused:
        with pytest.raises(ConfigError, match="best_metric/best_mode"):
            resume.check_best_terms(state, cfg, "last.pt")
    else:
        resume.check_best_terms(state, cfg, "last.pt")


# ---- the run folder removed or replaced under the run ------------------------------------


class Tracker:
    """An experiment tracker (utils/trackers.py) that keeps the steps it is given."""

    name, id = "fake", "1"

    def __init__(self):
        self.steps = []

    def log(self, values, step):
        self.steps.append(step)

    def close(self):
        pass


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_run_folder_removed_mid_run_is_not_written_again(tiny, monkeypatch, how):
    """Removed during epoch 2: the run stops at its next write (epoch 2's row and checkpoint)
    with one line and recreates nothing; replaced (another process took the path, as a second
    train.resume=auto would): it leaves the new folder alone. With a tracker on, the steps
    logged until then write no .tracked_step there, and the tracker gets none of them."""
    from {{ cookiecutter.package_name }} import loop
    from {{ cookiecutter.package_name }}.utils import logger

    tracker = Tracker()
    monkeypatch.setattr(logger, "open_trackers", lambda *args: [tracker])
    folder, read, taker = run_dir(tiny), loop.read_losses, RunFolder(run_dir(tiny), 2)

    def remove_at_step_20(run, *args):
        if run.progress.step == 20:
            shutil.rmtree(folder)
            if how == "replaced":
                taker.lock()
                (folder / "metrics.csv").write_text("epoch,step\n")
        return read(run, *args)

    monkeypatch.setattr(loop, "read_losses", remove_at_step_20)
    try:
        with pytest.raises(CheckpointError, match="was removed, moved or replaced while this"):
            fit(load_config(None, [*tiny, "train.epochs=3"]))
        if how == "removed":
            assert not folder.exists()
        else:
            assert snapshot(folder) == {folder / "metrics.csv": b"epoch,step\n"}
        assert max(tracker.steps) == 16  # log_every=4; step 20 was logged after the removal
    finally:
        taker.unlock()


# ---- a kill between the checkpoint and its metrics row -----------------------------------


class Killed(BaseException):
    """Stands in for kill -9 in-process: nothing after it runs (but the finally blocks)."""


def test_a_kill_right_after_a_checkpoint_loses_no_metrics_row(tiny, monkeypatch):
    save = RunFolder.save

    def save_then_die(self, state, step, *args):
        save(self, state, step, *args)
        if step == 32:  # the end of epoch 2
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(RunFolder, "save", save_then_die)
        with pytest.raises(Killed):
            fit(load_config(None, [*tiny, "train.epochs=3"]))
    assert fit(load_config(None, [*tiny, "train.epochs=3", "train.resume=auto"]))["epoch"] == 3
    assert epochs_logged(run_dir(tiny)) == ["1", "2", "3"]


def test_a_record_that_fails_leaves_no_checkpoint_and_no_temporary_file(tmp_path):
    """The row is written between the checkpoint's bytes and its name: if it fails (a full
    disk), the step file is never named and its bytes are removed."""
    state = {"model": {"w": torch.zeros(2)}, "progress": {"step": 1}, "config": {}}

    def full_disk():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        RunFolder(tmp_path, 2).save(state, 1, True, record=full_disk)
    assert list(tmp_path.iterdir()) == []
    written = []
    RunFolder(tmp_path, 2).save(state, 1, True, record=lambda: written.append(1))
    assert written == [1] and sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt",
        "last.pt",
        "step-00000001.pt",
    ]


_KILLED_AFTER_SAVE = """
import os, signal, sys
from {{ cookiecutter.package_name }}.checkpoint import run_folder
from {{ cookiecutter.package_name }}.tools.train import train_main

save = run_folder.RunFolder.save

def save_then_kill(self, state, step, *args):
    path = save(self, state, step, *args)
    if step == 32:
        os.kill(os.getpid(), signal.SIGKILL)
    return path

run_folder.RunFolder.save = save_then_kill
raise SystemExit(train_main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_9_right_after_a_checkpoint_loses_no_metrics_row(tmp_path, tiny):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED_AFTER_SAVE))
    proc = run_script(str(script), *tiny, "train.epochs=3", env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert checkpoint.load(run_dir(tiny) / "last.pt")["progress"]["step"] == 32
    assert fit(load_config(None, [*tiny, "train.epochs=3", "train.resume=auto"]))["epoch"] == 3
    assert epochs_logged(run_dir(tiny)) == ["1", "2", "3"]


# ---- a mid-epoch position the data no longer has -----------------------------------------


def tensor_data(folder: Path, train_rows: int) -> Path:
    """train.pt and an explicit val.pt: no split of the training data to compare on resume."""
    folder.mkdir()
    g = torch.Generator().manual_seed(train_rows)
    for split, rows in (("train", train_rows), ("val", 16)):
        x, y = torch.randn(rows, 6, generator=g), torch.arange(rows) % 2
        torch.save({"x": x, "y": y}, folder / f"{split}.pt")
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("smaller", "stopped at sample 48 of epoch 1, beyond the 32 training samples there"),
        ("batch", "stopped at sample 48 of epoch 1, and less than one batch .32 samples"),
    ],
)
def test_a_mid_epoch_resume_with_no_batch_left_is_refused(tiny, tmp_path, monkeypatch, change,
                                                          message):  # fmt: skip
    big, small = tensor_data(tmp_path / "big", 64), tensor_data(tmp_path / "small", 32)
    args = [*tiny_with(tiny, "data.name=tensors", "train.batch_size=8"), "model.name=mlp"]
    with monkeypatch.context() as patch:
        stop = stop_after(patch, 6)  # 48 of 64 samples: mid-epoch
        assert fit(load_config(None, [*args, *stop, f"data.root={big}"]))["stopped"] == "SIGTERM"
    before = snapshot(run_dir(tiny))
    again = [*args, "train.resume=auto"]
    again += [f"data.root={small}"] if change == "smaller" else [f"data.root={big}"]
    again += ["train.batch_size=32"] if change == "batch" else []
    with pytest.raises(ConfigError, match=message):
        fit(load_config(None, again))
    assert snapshot(run_dir(tiny)) == before
    assert os.path.exists(run_dir(tiny) / "last.pt")


def test_files_named_like_step_files_are_not_pruned_or_resumed(tmp_path):
    # Tools write files named step-N.*.pt beside the step files (a model's step-N.full.pt, an
    # artifact's step-N.ts.pt): none is a step checkpoint, to prune or resume from.
    folder = RunFolder(tmp_path, keep_last=1)
    full, artifact = tmp_path / "step-00000009.full.pt", tmp_path / "step-00000009.ts.pt"
    full.write_bytes(b"full weights")
    artifact.write_bytes(b"an artifact")
    for step in (1, 2):
        folder.save({"step": torch.tensor(step)}, step, is_best=False)
    assert [p.name for p in folder.step_files()] == ["step-00000002.pt"]
    assert full.read_bytes() == b"full weights" and artifact.read_bytes() == b"an artifact"
    assert full not in folder.checkpoint_files()
