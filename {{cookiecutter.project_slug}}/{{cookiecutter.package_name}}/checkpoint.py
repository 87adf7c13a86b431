"""Checkpoints: what they hold, crash-safe writing, keep-last-k, safe loading, clear errors.

A checkpoint holds the model, optimizer, scheduler and scaler states, the Progress (epoch,
step, position inside the epoch, best metric), every rank's RNG streams, the resolved config,
the data's meta (class names, normalisation, the validation split), "io" (the model's input
shape and dtype and output size, so prediction and export need no data) and metadata (torch
version, git commit, world size). The files of a run folder (keep-last-k, last.pt and
best.pt, choosing what to resume, the lock) are run_folder.py's.
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import subprocess
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .errors import CheckpointError, first_line
from .utils.seed import set_rng_state

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
    # Fields added later keep their defaults when an older checkpoint is restored.
    best_epoch: int | None = None  # the epoch (1-based) whose validation gave `best`
    bad_epochs: int = 0  # epochs since `best` last improved by more than early_stop_min_delta
    best_tie: float | None = None  # the tie-break metric (Config.tie_break) at `best`
    train_seconds: float = 0.0  # time in completed training epochs (no validation), all sessions
    samples: int = 0  # samples trained on in those epochs: with train_seconds, the throughput
    metrics: dict = field(default_factory=dict)  # the last validation metrics

    def improves(
        self,
        value: float,
        mode: str,
        min_delta: float = 0.0,
        epoch_end: bool = True,
        tie: tuple[float, str] | None = None,
    ) -> bool:
        """Record the validation `value` of the epoch just finished (self.epoch of them): the
        best if it is (True then), and whether it improved on the best by more than
        `min_delta`, which early stopping counts in bad_epochs. Not `epoch_end`: a validation
        inside epoch self.epoch + 1 (train.max_steps), which early stopping does not count.
        `tie`: (value, mode) of the metric that decides between equal values (small
        validation sets tie often): the later model wins only if it is better there."""
        sign = 1.0 if mode == "max" else -1.0
        if epoch_end:
            significant = self.best is None or sign * (value - self.best) > min_delta
            self.bad_epochs = 0 if significant else self.bad_epochs + 1
        better = self.best is None or sign * (value - self.best) > 0
        if value == self.best and tie is not None and self.best_tie is not None:
            better = (1.0 if tie[1] == "max" else -1.0) * (tie[0] - self.best_tie) > 0
        if better:
            self.best, self.best_epoch = value, self.epoch + (0 if epoch_end else 1)
            self.best_tie = tie[0] if tie is not None else None
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
    shards: str | None = None,
) -> dict:
    """Everything needed to continue as if never stopped (tensors and plain containers only).
    With `shards` (train.strategy=fsdp) the model and optimizer are in that folder instead."""
    if shards:
        weights = {"shards": shards}  # the folder's name: the run folder can move
    else:
        weights = {
            "model": model.state_dict(),  # the plain module: no module./_orig_mod. prefixes
            "optimizer": optimizer.state_dict(),
        }
    return {
        **weights,
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
    if "shards" not in state:  # a sharded state's model and optimizer: parallel.restore
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
    # A sharded checkpoint's model and optimizer are in the folder it names (parallel.py).
    sharded = ("model", "optimizer") if isinstance(state.get("shards"), str) else ()
    missing = [key for key in TRAINING_KEYS if key not in state and key not in sharded]
    wrong = [
        key
        for key in ("model", "progress", "config")
        if key not in sharded and not isinstance(state.get(key), dict)
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
    if "shards" in state:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is sharded (train.strategy=fsdp); write its full model "
            f"to one file with: python scripts/consolidate.py --checkpoint {path}"
        )
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
        fsync_dir(path.parent)
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
        # torch says "PytorchStreamReader failed...", "Invalid magic number; corrupt file?" and
        # more for bad bytes; the same class also carries allocation failures.
        if "memory" in str(exc).lower() or not _reads_back(path):
            raise CheckpointError(_unreadable(path, exc)) from None
        raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
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
    if isinstance(state.get("shards"), str):  # sharded (parallel.py): the folder beside it
        folder = path.parent / state["shards"]
        if not (folder / ".metadata").is_file():
            raise CorruptCheckpoint(
                f"checkpoint {str(path)!r} names the shard folder {str(folder)!r}, which is "
                "missing or incomplete"
            )
        state["shards"] = str(folder)
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
    reason = first_line(exc, 160).split(". ")[0]
    return (
        f"checkpoint {str(path)!r} is not a checkpoint (corrupt, truncated or not a torch "
        f"file: {reason})"
    )


def _unreadable(path: Path, exc: BaseException) -> str:
    reason = f"{type(exc).__name__}: {first_line(exc, 160)}"
    return (
        f"checkpoint {str(path)!r} could not be read ({reason}); "
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


def fsync_dir(path: Path) -> None:
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
