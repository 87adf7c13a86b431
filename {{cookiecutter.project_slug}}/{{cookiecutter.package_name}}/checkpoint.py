"""Checkpoints: what they hold, crash-safe writing, keep-last-k, safe loading, clear errors.

A checkpoint holds the model, optimizer, scheduler and scaler states, the Progress (epoch,
step, position inside the epoch, best metric), every rank's RNG streams, the resolved config
and metadata (torch version, git commit, world size). A run folder holds step-00001234.pt
(the newest `keep_last`), last.pt and best.pt (hard links to a step file, so they cost no
space), config.yaml, metrics.csv, tb/ and .lock (held by the process that trains the run).
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import shutil
import socket
import subprocess
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .errors import CheckpointError, ConfigError
from .utils.seed import set_rng_state

try:
    import fcntl  # advisory locks (Linux, macOS); elsewhere runs go without the folder lock
except ImportError:  # pragma: no cover
    fcntl = None

PREFIXES = ("module.", "_orig_mod.")  # added by DistributedDataParallel and torch.compile
TRAINING_KEYS = ("model", "optimizer", "scheduler", "scaler", "progress", "config")


class CorruptCheckpoint(CheckpointError):
    """The bytes are not a checkpoint (truncated, overwritten, not a torch file), so the file
    can be set aside. Other read failures (I/O, memory) say nothing about the file."""


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    epoch: int = 0  # the epoch in progress (or the next to start)
    step: int = 0  # optimizer steps taken in total
    epoch_samples: int = 0  # samples of this epoch's (global) order already trained on
    best: float | None = None  # best validation value of train.best_metric so far

    def improves(self, value: float, mode: str) -> bool:
        """Record `value` as the best if it is; True when it is."""
        better = self.best is None or (value > self.best if mode == "max" else value < self.best)
        if better:
            self.best = value
        return better


def training_state(
    model,
    optimizer,
    scheduler,
    scaler,
    progress: Progress,
    config: dict,
    rngs: list,
    world_size: int,
) -> dict:
    """Everything needed to continue as if never stopped (tensors and plain containers only)."""
    return {
        "model": model.state_dict(),  # the plain module: no module./_orig_mod. prefixes
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "progress": asdict(progress),
        "rng": rngs,  # one entry per rank
        "config": config,
        "meta": {
            "torch": str(torch.__version__),
            "git_commit": _git_commit(),
            "world_size": world_size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    }


def restore_training_state(
    state: dict,
    model,
    optimizer,
    scheduler,
    scaler,
    progress: Progress,
    rank: int,
    world_size: int,
) -> None:
    """Load a training state (read on the CPU) into objects on the training device:
    load_state_dict copies each tensor to where its parameter lives."""
    load_model_state(model, state["model"], "resume")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:  # empty when saved without fp16; a fresh scaler starts from defaults
        scaler.load_state_dict(state["scaler"])
    for key, value in state["progress"].items():
        setattr(progress, key, value)
    rngs = state.get("rng", [])
    # Exact continuation needs this rank's own RNG streams; on another world size the ranks
    # keep their fresh seeds (the data order still resumes exactly, see data/sampler.py).
    if len(rngs) == world_size:
        set_rng_state(rngs[rank])


def check_training_state(state: dict, path: str | Path) -> dict:
    """`state` if it holds what a resume needs, else a CheckpointError saying what it is."""
    if is_bare_weights(state):
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds model weights only, not a training state; "
            f"start a new run from them with train.init_from={path}"
        )
    missing = [key for key in TRAINING_KEYS if key not in state]
    wrong = [
        key for key in ("model", "progress", "config") if not isinstance(state.get(key), dict)
    ]
    if missing or wrong:
        what = f"no {', '.join(missing)}" if missing else f"its {wrong[0]!r} is not a mapping"
        raise CheckpointError(
            f"checkpoint {str(path)!r} is not a training checkpoint of this project ({what}); "
            f"resume from a file this project saved, or use train.init_from={path}"
        )
    return state


def model_weights(state: dict, path: str | Path) -> dict:
    """The model's state_dict: a training checkpoint's, or a bare `model.state_dict()` file."""
    if is_bare_weights(state):
        return state
    if isinstance(state.get("model"), dict):
        return state["model"]
    raise CheckpointError(
        f"checkpoint {str(path)!r} holds no model weights (no 'model' entry, and not a "
        "state_dict of tensors); pass a file saved by training or torch.save(model.state_dict())"
    )


def is_bare_weights(state: dict) -> bool:
    return bool(state) and all(isinstance(value, torch.Tensor) for value in state.values())


def note_batch_change(state: dict, effective_batch: int) -> None:
    """Resuming on another number of ranks continues exactly when the effective batch stays."""
    train, ranks = state["config"].get("train", {}), state.get("meta", {}).get("world_size", 1)
    saved = train.get("batch_size", 0) * train.get("grad_accum_steps", 1) * ranks
    if saved and saved != effective_batch:
        print(
            f"note: the checkpoint's effective batch was {saved} ({ranks} ranks), now "
            f"{effective_batch}: the data resumes at the same sample, the lr schedule at the "
            f"same step; keep train.batch_size x train.grad_accum_steps x ranks = {saved} to "
            "continue exactly"
        )


def atomic_save(obj, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`.

    A rename within one filesystem is atomic, so a reader (or a run killed at any instant)
    sees either the old complete file or the new complete file, never a truncated one.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path) -> dict:
    """Read a checkpoint onto the CPU with weights_only=True: tensors and plain containers only,
    never pickled code. Restoring copies each tensor to where its parameter lives, so a file
    saved on any device resumes on any other (and RNG states stay the CPU tensors torch needs).

    Raises CorruptCheckpoint when the bytes are not a checkpoint, CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} not found; check the path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc) or "Unsupported global" in str(exc):
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds pickled Python objects, which weights_only "
                "loading refuses (they can run code); re-save it with tensors and plain "
                "containers only, if you trust its source"
            ) from None
        raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
    except (EOFError, zipfile.BadZipFile, KeyError, IndexError, ValueError) as exc:
        raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
    except RuntimeError as exc:
        if "PytorchStreamReader" in str(exc) or "zip archive" in str(exc):
            raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
        raise CheckpointError(_unreadable(path, exc)) from None
    except OSError as exc:
        # torch's zip reader raises EINVAL on a truncated file: the file's fault only if
        # plain reading succeeds. Any other errno (EIO, ESTALE, EACCES...) is the system's.
        if exc.errno == errno.EINVAL and _reads_back(path):
            raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
        raise CheckpointError(_unreadable(path, exc)) from None
    except MemoryError as exc:
        raise CheckpointError(_unreadable(path, exc)) from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict of state"
        )
    return state


def _reads_back(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
        return True
    except OSError:
        return False


def _not_a_checkpoint(path: Path, exc: BaseException) -> str:
    reason = _first_line(exc).split(". ")[0]
    return (
        f"checkpoint {str(path)!r} is not a checkpoint (corrupt, truncated or not a torch "
        f"file: {reason})"
    )


def _unreadable(path: Path, exc: BaseException) -> str:
    return (
        f"checkpoint {str(path)!r} could not be read ({type(exc).__name__}: {_first_line(exc)}); "
        "nothing was renamed: fix the cause (disk, network filesystem, permissions, memory) "
        "and run the same command again"
    )


def strip_prefixes(state_dict: dict) -> dict:
    out = {}
    for key, value in state_dict.items():
        while key.startswith(PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def load_model_state(model: nn.Module, state_dict: dict, source: str) -> None:
    """Strict load whose error names every mismatch on one line."""
    state_dict = strip_prefixes(state_dict)
    problems = _mismatches(model.state_dict(), state_dict)
    if problems:
        raise CheckpointError(
            f"checkpoint {source!r} does not fit this model: {problems}; use the model.* and "
            "data.* settings it was trained with, or train.init_from to reuse what fits"
        )
    model.load_state_dict(state_dict)


def init_from(model: nn.Module, path: str) -> list[str]:
    """Fine-tuning start: copy every tensor whose name and shape match; return those skipped.
    Takes a training checkpoint or a bare state_dict file."""
    weights = strip_prefixes(model_weights(load(path), path))
    own = model.state_dict()
    fits = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    if not fits:
        raise CheckpointError(
            f"train.init_from={path!r}: no tensor fits this model ({_mismatches(own, weights)})"
        )
    model.load_state_dict(fits, strict=False)
    return sorted(set(own) - set(fits))


class CheckpointManager:
    """A run folder's checkpoints: saving with keep-last-k, choosing what to resume from, and
    the lock that keeps a second process out of the folder."""

    def __init__(self, run_dir: Path, keep_last: int):
        self.run_dir, self.keep_last = run_dir, keep_last
        self._lock_fd: int | None = None

    def step_files(self) -> list[Path]:
        return sorted(self.run_dir.glob("step-*.pt"), reverse=True)  # newest first

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint of the run, loadable or not (files set aside as *.bad included)."""
        patterns = ("step-*.pt", "step-*.pt.bad", "last.pt", "best.pt")
        return [path for pattern in patterns for path in sorted(self.run_dir.glob(pattern))]

    def save(self, state: dict, step: int, is_best: bool) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / f"step-{step:08d}.pt"
        atomic_save(state, path)
        _atomic_link(path, self.run_dir / "last.pt")
        if is_best:
            _atomic_link(path, self.run_dir / "best.pt")
        for old in self.step_files()[self.keep_last :]:
            old.unlink(missing_ok=True)  # best.pt is its own link: pruning keeps its data
        return path

    def find(self, resume: str, run_name: str, say=print) -> tuple[dict, Path] | None:
        """What train.resume asks to continue from: "" nothing (a fresh run, refused where the
        run has checkpoints); "auto" the newest checkpoint that loads, nothing where the
        folder has none, an error where it has some and none loads; else the path given."""
        if resume == "auto":
            found = self.latest(warn=say, quarantine=True)
            if found is None and self.checkpoint_files():
                names = ", ".join(path.name for path in self.checkpoint_files())
                raise CheckpointError(
                    f"no checkpoint of run {run_name!r} loads ({names} in {self.run_dir}); "
                    "resume from a good file with train.resume=PATH, or start a new run with "
                    "run.name=<new name>"
                )
            if found is None:
                say(f"train.resume=auto: no checkpoint in {self.run_dir}, starting fresh")
            return found
        if resume:
            return check_training_state(load(resume), resume), Path(resume)
        if self.checkpoint_files():
            raise ConfigError(
                f"run {run_name!r} already exists in {self.run_dir}; continue it with "
                "train.resume=auto, or start a new one with run.name=<new name>"
            )
        return None

    def latest(self, warn=print, quarantine=False) -> tuple[dict, Path] | None:
        """Newest checkpoint that loads among the step files, last.pt and best.pt.

        A file whose bytes are not a checkpoint is reported and the next one tried; with
        `quarantine` a step file that fails so is renamed *.bad (kept for a look, out of the
        way of pruning). Any other failure (I/O, memory) stops here and renames nothing:
        falling back to an older file would lose the newer one's work at the next prune."""
        tried = set()
        for path in [*self.step_files(), self.run_dir / "last.pt", self.run_dir / "best.pt"]:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if (stat.st_dev, stat.st_ino) in tried:  # last.pt and best.pt link to step files
                continue
            tried.add((stat.st_dev, stat.st_ino))
            try:
                return check_training_state(load(path), path), path
            except CorruptCheckpoint as exc:
                warn(f"warning: skipping {exc}")
                if quarantine and path.name.startswith("step-"):
                    path.rename(path.with_name(path.name + ".bad"))
        return None

    def lock(self) -> None:
        """Hold the run folder for this process: a second one (a duplicate job, a resume while
        the run still trains) gets one line instead of a race over the same files. The OS
        releases the lock when the process ends, by kill -9 too: no stale lock is left."""
        if self._lock_fd is not None or fcntl is None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run folder {str(self.run_dir)!r} is in use ({holder}); wait for that run to "
                "end or stop it, or choose another run.name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"held by pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def remove_stale_temporaries(self) -> None:
        """Temporary files left by a run killed mid-save (never read: the rename never ran)."""
        for tmp in self.run_dir.glob(".*.tmp*"):
            tmp.unlink(missing_ok=True)


def _atomic_link(target: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:  # a filesystem without hard links: copy instead
        shutil.copyfile(target, tmp)
    os.replace(tmp, link)


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not possible (nor needed) on Windows.
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _mismatches(own: dict, theirs: dict) -> str:
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    shapes = [
        f"{k} {tuple(theirs[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in theirs and tuple(theirs[k].shape) != tuple(own[k].shape)
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            more = f" and {len(items) - 3} more" if len(items) > 3 else ""
            parts.append(f"{label}: {', '.join(items[:3])}{more}")
    return "; ".join(parts)


@functools.cache  # once per run: the code that runs is the code at start, and git costs ~5 ms
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__
