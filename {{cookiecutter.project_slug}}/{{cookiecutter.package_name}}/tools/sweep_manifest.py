"""A sweep folder's records: sweep.json read and checked (a damaged one is one line, not a
traceback), files written whole or not at all, the content of the --config file the sweep was
started with, and the locks that keep two sweep processes from trampling each other's records
(and a trial from starting while a process left by a killed sweep still saves its run). An
Optuna sweep's study.db is checked before it is used: damaged, locked, or another sweep's,
it is one line too, as is a failure of the study while the sweep runs."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import yaml

from ..errors import ConfigError, first_line
from ..utils import locks

# What going without the manifest lock risks (a filesystem without locks).
UNLOCKED_MANIFEST = "two sweep processes (SLURM array tasks) could overwrite each other's records"
UNLOCKED_SWEEP = "two sweeps of one folder could run the same trials at once"
UNLOCKED_TRIAL = "a trial could start while a process left by a killed sweep still saves it"
# Each trial's fields in sweep.json, and the types a readable manifest has.
TRIAL_FIELDS = {"id": str, "group": str, "settings": dict, "overrides": list, "state": str}
# Failed writes that every other trial of the sweep would meet too (the reasons as trials print
# them): the sweep stops at the first, and that trial is run again when the sweep reruns.
WRITE_FAILURES = tuple(map(os.strerror, (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)))
# The tables of an Optuna study; how long the check of study.db waits for another process's
# write lock on it (optuna itself waits 5 s, then fails).
STUDY_TABLES = {"studies", "trials", "version_info"}
LOCK_WAIT_S = 2.0


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
    lock = folder / ".sweep.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locks.lock(fd, lock, UNLOCKED_MANIFEST)  # serialises SLURM array tasks' updates
        yield read(folder / "sweep.json")
    finally:
        os.close(fd)


def hold_sweep(folder: Path, one_trial: bool) -> int:
    """Take the sweep's own lock for as long as this process lives; returns its descriptor.

    A whole sweep holds it exclusively; SLURM array tasks (one trial each, `one_trial`) share
    it with each other. A second sweep of the same folder is refused rather than starting
    trials that the first one runs, which both would then record as failed."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".sweep.run.lock"
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
    """A sha256 of the settings in the sweep's --config file and in the files it extends, as
    read (so a comment or a reformatting is no change); None without a file, or when one no
    longer reads (load_config checked them when the sweep started)."""
    if config is None:
        return None
    digest, seen, path = hashlib.sha256(), set(), Path(config)
    try:
        while path.resolve() not in seen:
            seen.add(path.resolve())
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            digest.update(json.dumps(data, sort_keys=True, default=str).encode())
            if not isinstance(data, dict) or not isinstance(data.get("extends"), str):
                break
            path = path.parent / data["extends"]
    except (OSError, ValueError, yaml.YAMLError):  # gone, not UTF-8, not YAML: not the same
        return None
    return digest.hexdigest()


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
    lock = run_dir / ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # no lock file: no process has trained it; other errors: the trial says
        return False
    try:
        locks.lock(fd, lock, UNLOCKED_TRIAL, wait=False)  # released when fd closes
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def check_study(path: Path, name: str) -> None:
    """Refuse, before anything is written, a study.db that optuna would fail on with a
    traceback (damaged, truncated, not a file, locked by another process) or would write
    into although it is no study of this sweep (another program's database, another sweep's
    study). No file, or an empty one, is a new study."""
    if not os.path.lexists(path):
        return
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a file; {STUDY_AFRESH}")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=LOCK_WAIT_S)
        try:
            problem = _study_problem(con, name)
            con.execute("BEGIN IMMEDIATE")  # the write lock another process may hold
            con.rollback()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ConfigError(_study_line(path, exc)) from None
    if problem:
        raise ConfigError(f"{str(path)!r} {problem}; {STUDY_AFRESH}")


STUDY_AFRESH = (
    "remove it (or move it away) to start the study again from sweep.json's records: the "
    "finished trials are kept"
)


def _study_problem(con, name: str) -> str | None:
    if con.execute("PRAGMA quick_check").fetchone()[0] != "ok":
        return "is damaged (SQLite's check of it fails)"
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if tables and not tables >= STUDY_TABLES:
        return "is not an Optuna study (another program's database?)"
    names = [row[0] for row in con.execute("SELECT study_name FROM studies")] if tables else []
    if names and name not in names:
        return f"holds the Optuna study {names[0]!r}, not {name!r} (another sweep's?)"
    return None


def not_the_study(path: Path, trial: str) -> str:
    return (
        f"{str(path)!r} does not hold trial {trial} of sweep.json as it was run (another "
        f"sweep's study.db?); {STUDY_AFRESH}"
    )


def _study_line(path: Path, exc: sqlite3.Error) -> str:
    text = first_line(exc, 120)
    if "locked" in text:
        fix = (
            "another process holds it (a second sweep, optuna-dashboard or sqlite3 writing to "
            "it): wait for that process to finish, or stop it, then run the same command again"
        )
    elif "full" in text:
        fix = "free space on that disk, then run the same command again"
    elif "readonly" in text or "unable to open" in text:
        fix = "make it and its folder writable, or remove it (a new study)"
    else:  # "file is not a database", "database disk image is malformed"
        fix = STUDY_AFRESH
    return f"the sweep's Optuna study {str(path)!r} cannot be used ({text}); {fix}"


@contextlib.contextmanager
def study_errors(path: Path):
    """A study error while the sweep runs (study.db locked or damaged meanwhile, a full disk,
    a schema of another optuna version) as one line, not SQLAlchemy's traceback."""
    try:
        yield
    except Exception as exc:
        cause, seen = exc, set()
        while cause is not None and not isinstance(cause, sqlite3.Error) and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, sqlite3.Error):
            raise ConfigError(_study_line(path, cause)) from None
        if isinstance(exc, RuntimeError) and "table schema" in str(exc):
            raise ConfigError(
                f"{str(path)!r} was set up by another version of optuna: {first_line(exc, 300)} "
                f"(or {STUDY_AFRESH})"
            ) from None
        raise
