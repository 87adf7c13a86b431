"""File locks on filesystems without them (NFS or Lustre mounted without locks): runs and tools
go on with one warning; only a lock another process holds means "in use"."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from conftest import flock_failing_with

from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import locks
from {{ cookiecutter.package_name }}.utils.logger import record_run

NO_LOCKS = "does not support file locks"


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


def test_runs_csv_and_a_run_lock_are_locked_as_nfs_allows(tmp_path, nfs_flock):
    """record_run's lock and a run folder's take locks that NFS grants (no EBADF)."""
    record_run(tmp_path, {"run": "a", "steps": 1})
    assert (tmp_path / "runs.csv").read_text().splitlines()[1].endswith(",a,1")
    folder = RunFolder(tmp_path / "a", keep_last=1)
    folder.lock()
    folder.unlock()


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
    """replace_text, behind every config, record and prediction table: a write that
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
