"""Checkpoints: what they hold, crash-safe writing, keep-last-k, safe loading, clear errors.

A checkpoint holds the model, optimizer, scheduler and scaler states, the Progress (epoch,
step, position inside the epoch, best metric), every rank's RNG streams, the resolved config
and metadata (torch version, git commit, world size). A run folder holds step-00001234.pt
(the newest `keep_last`), last.pt and best.pt (hard links to a step file, so they cost no
space), config.yaml, metrics.csv and tb/.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .errors import CheckpointError, ConfigError
from .utils.seed import set_rng_state

PREFIXES = ("module.", "_orig_mod.")  # added by DistributedDataParallel and torch.compile


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
    load_model_state(model, state["model"], "resume")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    for key, value in state["progress"].items():
        setattr(progress, key, value)
    rngs = state.get("rng", [])
    # Exact continuation needs this rank's own RNG streams; on another world size the ranks
    # keep their fresh seeds (the data order still resumes exactly, see data/sampler.py).
    if len(rngs) == world_size:
        set_rng_state(rngs[rank])


def find_resume_state(
    resume: str, run_name: str, ckpts: CheckpointManager, device, is_main: bool
) -> dict | None:
    """The state to continue from, per train.resume; refuses to overwrite an existing run."""
    if resume == "auto":
        found = ckpts.latest(
            map_location=device, warn=print if is_main else _quiet, quarantine=is_main
        )
        if found is None:
            if is_main:
                print(f"train.resume=auto: no checkpoint in {ckpts.run_dir}, starting fresh")
            return None
        return found[0]
    if resume:
        return load(resume, map_location=device)
    if (ckpts.run_dir / "config.yaml").exists() or ckpts.step_files():
        raise ConfigError(
            f"run {run_name!r} already exists in {ckpts.run_dir}; continue it with "
            "train.resume=auto, or start a new one with run.name=<new name>"
        )
    return None


def note_batch_change(state: dict, effective_batch: int) -> None:
    """Resuming on another number of ranks continues exactly when the effective batch stays."""
    train, ranks = state["config"]["train"], state["meta"]["world_size"]
    saved = train["batch_size"] * train["grad_accum_steps"] * ranks
    if saved != effective_batch:
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


@functools.cache  # once per run: the code that runs is the code at start, and git costs ~5 ms
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _quiet(*args) -> None:
    pass


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__
