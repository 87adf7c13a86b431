"""Crash-safe checkpoints: atomic writes, keep-last-k, safe loading, clear errors.

Layout of a run folder: step-00001234.pt (the newest `keep_last`), last.pt and best.pt (hard
links to a step file, so they cost no space), config.yaml, metrics.csv, tb/.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import torch
from torch import nn

from .errors import CheckpointError

PREFIXES = ("module.", "_orig_mod.")  # added by DistributedDataParallel and torch.compile


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


def load(path: str | Path, map_location="cpu") -> dict:
    """Load with weights_only=True: tensors and plain containers only, never pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} not found; check the path")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower():
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds pickled Python objects, which weights_only "
                "loading refuses (they can run code); re-save it with tensors and plain "
                "containers only, if you trust its source"
            ) from None
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt ({_first_line(exc)})"
        ) from None
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or truncated ({_first_line(exc)})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a dict of state")
    return state


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
    """Fine-tuning start: copy every tensor whose name and shape match; return those skipped."""
    state = load(path)
    weights = strip_prefixes(state.get("model", state))
    own = model.state_dict()
    fits = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    if not fits:
        raise CheckpointError(
            f"train.init_from={path!r}: no tensor fits this model ({_mismatches(own, weights)})"
        )
    model.load_state_dict(fits, strict=False)
    return sorted(set(own) - set(fits))


class CheckpointManager:
    """Saves step checkpoints with keep-last-k and finds the newest one that loads."""

    def __init__(self, run_dir: Path, keep_last: int):
        self.run_dir, self.keep_last = run_dir, keep_last

    def step_files(self) -> list[Path]:
        return sorted(self.run_dir.glob("step-*.pt"), reverse=True)  # newest first

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

    def latest(self, map_location="cpu", warn=print, quarantine=False) -> tuple[dict, Path] | None:
        """Newest checkpoint that loads; a corrupt one is reported and the previous one tried.

        With `quarantine` (rank 0 only) a file that fails is renamed to *.bad: kept for a
        look, but out of the way of keep-last pruning and of the next resume."""
        candidates = self.step_files()
        last = self.run_dir / "last.pt"
        if last.is_file() and not candidates:
            candidates = [last]
        for path in candidates:
            try:
                return load(path, map_location), path
            except CheckpointError as exc:
                warn(f"warning: skipping {exc}")
                if quarantine and path.name != "last.pt":
                    path.rename(path.with_name(path.name + ".bad"))
        return None

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


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__
