"""A sweep folder's records: sweep.json read and checked (a damaged one is one line, not a
traceback), files written whole or not at all, the content of the --config file the sweep was
started with, and the locks that keep two sweep processes from trampling each other's records
(and a trial from starting while a process left by a killed sweep still saves its run). An
Optuna sweep's study.db is sweep_study.py's."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path

from ..config import file_settings
from ..errors import ConfigError
from ..utils import locks, run_files

# What going without the manifest lock risks (a filesystem without locks).
UNLOCKED_MANIFEST = "two sweep processes (SLURM array tasks) could overwrite each other's records"
UNLOCKED_SWEEP = "two sweeps of one folder could run the same trials at once"
UNLOCKED_TRIAL = "a trial could start while a process left by a killed sweep still saves it"
# Each trial's fields in sweep.json, and the types a readable manifest has.
TRIAL_FIELDS = {"id": str, "group": str, "settings": dict, "overrides": list, "state": str}
# Failed writes that every other trial of the sweep would meet too (the reasons as trials print
# them): the sweep stops at the first, and that trial is run again when the sweep reruns.
WRITE_FAILURES = tuple(map(os.strerror, (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)))


def read(path: Path) -> dict | None:
    """sweep.json as a dict, None when there is none; ConfigError when it is damaged."""
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        problem = _problem(manifest)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"not valid JSON ({str(exc)[:80]})"
    if problem:
        raise ConfigError(
            f"{str(path)!r} is damaged: {problem}; remove it to start the sweep's records "
            "afresh (finished trials resume from their run folders) or choose another --name"
        )
    return manifest


def _problem(manifest) -> str | None:
    if not isinstance(manifest, dict):
        return "not a JSON object"
    for field, kind in (("fixed", list), ("trials", list)):
        if not isinstance(manifest.get(field), kind):
            return f"no {field!r} list"
    for i, trial in enumerate(manifest["trials"]):
        if not isinstance(trial, dict):
            return f"trial {i} is not an object"
        for field, kind in TRIAL_FIELDS.items():
            if not isinstance(trial.get(field), kind):
                return f"trial {i} has no {field!r}"
        if "optuna" in manifest and not isinstance(trial.get("params"), dict):
            return f"trial {i} has no 'params'"  # what the study is told the trial ran
    return None


def write(path: Path, manifest: dict) -> None:
    locks.replace_text(path, json.dumps(manifest, indent=1) + "\n")


@contextlib.contextmanager
def locked(folder: Path):
    """sweep.json under an exclusive lock, held for one read-modify-write (None when absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / run_files.SWEEP_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locks.lock(fd, lock, UNLOCKED_MANIFEST)  # serialises SLURM array tasks' updates
        yield read(folder / run_files.SWEEP)
    finally:
        os.close(fd)


def hold_sweep(folder: Path, one_trial: bool) -> int:
    """Take the sweep's own lock for as long as this process lives; returns its descriptor.

    A whole sweep holds it exclusively; SLURM array tasks (one trial each, `one_trial`) share
    it with each other. A second sweep of the same folder is refused rather than starting
    trials that the first one runs, which both would then record as failed."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / run_files.SWEEP_RUN_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locks.lock(fd, lock, UNLOCKED_SWEEP, wait=False, shared=one_trial)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"sweep {folder.name!r} is already running in another process ({folder}); wait "
            "for it to finish (or stop it), or choose another --name"
        ) from None
    return fd


def failed_write(line: str) -> str | None:
    """A trial's error line up to its reason, where that is a failed write (WRITE_FAILURES)."""
    reason = next((r for r in WRITE_FAILURES if r in line), None)
    return line.removeprefix("error: ").partition(reason)[0] + reason if reason else None


def error_line(path: Path) -> str:
    """What sweep.json records of a failed trial: its last error line (from its .err log)."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1][:300]


def config_digest(config: str | None) -> str | None:
    """A sha256 of the settings that the sweep's --config file gives, the files it extends
    laid under it as load_config reads them (so a comment, a reformatting or a setting moved
    between the files is no change); None without a file, or when it no longer reads
    (load_config checked it when the sweep started)."""
    if config is None:
        return None
    try:
        settings = file_settings(config)
    except (ConfigError, OSError):  # gone, not UTF-8, not YAML: not the same settings
        return None
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def check_config(folder: Path, saved: dict, config: str | None, digest: str | None) -> bool:
    """Refuse to continue a sweep whose --config file (or a file it extends) now holds other
    settings: its new trials would train other models than the ones it recorded, ranked
    together. False when the record predates the digest (the caller records it then)."""
    if "config_digest" not in saved:
        return False
    if saved["config_digest"] != digest:
        raise ConfigError(
            f"sweep {folder.name!r} in {folder.parent} was started with other settings in "
            f"its --config file {config!r} (or in a file it extends): its trials would train "
            "other models than the ones it recorded; put the file back as it was, or choose "
            "another --name"
        )
    return True


def run_busy(run_dir: Path) -> bool:
    """Whether another process holds the lock of a trial's run folder: a trial that a killed
    sweep left behind (kill -9: the trial got SIGTERM and saves), or a train.py of that run."""
    lock = run_dir / run_files.RUN_LOCK
    try:
        # Opened for writing, as NFS needs for a lock (its flock is an fcntl lock); the probe
        # is shared, so that two sweep processes probing one run do not see each other.
        fd = os.open(lock, os.O_RDWR)
    except OSError:  # no lock file: no process has trained it; other errors: the trial says
        return False
    try:
        locks.lock(fd, lock, UNLOCKED_TRIAL, wait=False, shared=True)  # released when fd closes
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
