"""A sweep folder's records: sweep.json read and checked (a damaged one is one line, not a
traceback), files written whole or not at all, and the locks that keep two sweep processes
from trampling each other's records."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..utils import locks

# What going without the manifest lock risks (a filesystem without locks).
UNLOCKED_MANIFEST = "two sweep processes (SLURM array tasks) could overwrite each other's records"
UNLOCKED_SWEEP = "two sweeps of one folder could run the same trials at once"
# Each trial's fields in sweep.json, and the types a readable manifest has.
TRIAL_FIELDS = {"id": str, "group": str, "settings": dict, "overrides": list, "state": str}


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
