"""File locks on filesystems without them (NFS or Lustre mounted without locks): runs and sweeps
go on with one warning; only a lock another process holds means "in use"."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest
from conftest import ROOT

from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools import sweep, sweep_cli, sweep_manifest
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import locks
from {{ cookiecutter.package_name }}.utils.logger import record_run

NO_LOCKS = "does not support file locks"


def flock_failing_with(monkeypatch, error: OSError) -> None:
    def flock(fd, operation):
        raise error

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(locks, "_warned", set())  # each test sees its first warning


@pytest.mark.slow
@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_run_trains_on_a_filesystem_without_locks_with_one_warning(
    tiny, monkeypatch, capsys, code
):
    flock_failing_with(monkeypatch, OSError(code, "no locks here"))
    overrides = [*tiny, "train.epochs=1"]
    fit(load_config(None, overrides))
    out = capsys.readouterr().out
    run = Path(load_config(None, overrides).run.output_dir)
    assert (run / "default" / "last.pt").exists() and (run / "runs.csv").exists()
    warnings = [line for line in out.splitlines() if NO_LOCKS in line]
    assert warnings and all(line.startswith("warning: ") for line in warnings)
    assert "two processes training the same run would not be stopped" in warnings[0]
    assert len({line for line in warnings}) == len(warnings)  # each place warns once


def test_a_sweep_manifest_is_written_on_a_filesystem_without_locks(tmp_path, monkeypatch, capsys):
    flock_failing_with(monkeypatch, OSError(errno.ENOLCK, "No locks available"))
    args = sweep_cli._parser().parse_args(
        ["--name", "nl", "train.lr=1e-3,3e-3", "run.device=cpu", f"run.output_dir={tmp_path}"]
    )
    made = sweep.Sweep.create(ROOT, args)
    made.update(made.trials[0], state="done", exit_code=0)
    again = sweep.Sweep.create(ROOT, args)  # a rerun reads the recorded state
    assert [t["state"] for t in again.trials] == ["done", "pending"]
    assert NO_LOCKS in capsys.readouterr().out


@pytest.fixture
def nfs_flock(monkeypatch):
    """flock as Linux's NFS client does it (it emulates flock with fcntl locks): an exclusive
    lock needs a descriptor open for writing, a shared one for reading, else EBADF."""
    real = fcntl.flock

    def flock(fd, operation):
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        if operation & fcntl.LOCK_EX and mode == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if operation & fcntl.LOCK_SH and mode == os.O_WRONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)


def test_runs_csv_and_a_trials_lock_are_locked_as_nfs_allows(tmp_path, nfs_flock):
    """record_run's lock and the sweep's check of a trial's run folder take locks that NFS
    grants (no EBADF), and a run folder another process holds still reads as busy."""
    record_run(tmp_path, {"run": "a", "steps": 1})
    assert (tmp_path / "runs.csv").read_text().splitlines()[1].endswith(",a,1")
    run = tmp_path / "a"
    folder = RunFolder(run, keep_last=1)
    # What training holds (and a trial that a killed sweep left behind). flock locks belong to
    # an open file, so run_busy's own descriptor meets it as another process's would.
    folder.lock()
    assert sweep_manifest.run_busy(run) is True
    folder.unlock()
    assert sweep_manifest.run_busy(run) is False


def test_a_lock_held_elsewhere_still_means_in_use(tmp_path, monkeypatch):
    flock_failing_with(monkeypatch, BlockingIOError(errno.EWOULDBLOCK, "held"))
    with pytest.raises(ConfigError, match="is in use"):
        RunFolder(tmp_path / "run", keep_last=1).lock()


def test_other_lock_errors_are_not_taken_for_a_filesystem_without_locks(tmp_path, monkeypatch):
    flock_failing_with(monkeypatch, OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError, match="Input/output error"):
        RunFolder(tmp_path / "run", keep_last=1).lock()


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_rewrite_keeps_the_old_file_whole_and_names_it(tmp_path, monkeypatch, durable):
    """replace_text, behind every config, sweep record and prediction table: a write that
    fails midway (a full disk) leaves the previous text, no temporary file, and an error
    naming the file it was for."""
    path = tmp_path / "config.yaml"
    locks.replace_text(path, "old: 1\n", durable=durable)

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: FullDisk(real_open(*a, **k)))
    with pytest.raises(OSError, match="No space left") as failed:
        locks.replace_text(path, "new: 2\n" * 1000, durable=durable)
    monkeypatch.undo()
    assert failed.value.filename == str(path)
    assert path.read_text() == "old: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
