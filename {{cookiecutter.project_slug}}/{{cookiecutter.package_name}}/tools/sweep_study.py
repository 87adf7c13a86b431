"""An Optuna sweep's study.db, checked before it is used: damaged, locked, or another
sweep's, it is one line naming it rather than optuna's traceback, as is a failure of the
study while the sweep runs (sweep_optuna.py runs the study); and the steps at which the
pruner compares trials, read from their metrics.csv."""

from __future__ import annotations

import contextlib
import csv
import os
import sqlite3
from pathlib import Path

from ..errors import ConfigError, first_line

# The tables of an Optuna study; how long the check of study.db waits for another process's
# write lock on it (optuna itself waits 5 s, then fails).
STUDY_TABLES = {"studies", "trials", "version_info"}
LOCK_WAIT_S = 2.0


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
    elif "full" in text or "disk I/O" in text:  # ENOSPC, EFBIG (ulimit -f): a write failed
        fix = (
            "no room to write it (a full disk or a file-size limit): free space or raise the "
            "limit, then run the same command again (the study is kept)"
        )
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


# Optuna's steps are thousandths of an epoch: the pruner compares trials at equal steps, and an
# epoch is the same share of training in every trial whatever its batch size or accumulation
# (optimizer steps are not); a validation inside an epoch (train.max_steps) has its own step.
STEP_UNIT = 1000


def prune_warmup(epochs: float | None, trial_epochs: int) -> int:
    """Optuna's n_warmup_steps: no trial is pruned at or before `epochs` (default: a quarter
    of its train.epochs, at least 1), when one epoch's validation is mostly noise."""
    if epochs is None:
        epochs = max(1, -(-trial_epochs // 4))
    return int(epochs * STEP_UNIT) + 1  # the pruner stops no trial at a step below this


def _report(asked, path: Path, metric: str, reported: dict) -> bool:
    """Report the new validation values; True when the pruner says stop."""
    for step, value in step_values(path, metric).items():
        if step not in reported:
            reported[step] = value
            asked.report(value, step)
    return bool(reported) and asked.should_prune()


def step_values(path: Path, metric: str) -> dict[int, float]:
    """{step: val/<metric>} from the complete lines of a metrics.csv being written, the step
    in thousandths of an epoch (STEP_UNIT: the row of epoch 1.25 is step 1250)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
        return {}
    values = {}
    for row in csv.DictReader(line for line in lines if line.endswith("\n")):
        try:
            step, value = round(float(row["epoch"]) * STEP_UNIT), float(row[f"val/{metric}"])
        except (KeyError, TypeError, ValueError, OverflowError):  # a training row, no epoch
            continue
        values.setdefault(step, value)
    return values
