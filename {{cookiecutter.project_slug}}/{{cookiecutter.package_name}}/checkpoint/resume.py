"""Continuing a run: which checkpoint (rank 0 chooses, every rank reads the same file), what
changed since it was saved, and whether anything is left to train."""

from __future__ import annotations

from .. import distributed
from ..config import Config, flatten, to_dict
from ..distributed import DistInfo
from ..errors import CheckpointError, ConfigError, UserError
from . import files
from .run_folder import RunFolder
from .state import Progress

# Settings a resumed run cannot change: the seed fixes the data order that the saved position
# points into, and the warm-up is already (partly) done.
FIXED = (
    "run.seed",
    "train.warmup_steps",
    # What is trained on and validated against: changing them mid-run is a different run.
    "data.name",
    "data.val_fraction",
    "data.split_seed",
    "data.folds",
    "data.fold",
    "model.name",
    "task.name",
)
# Settings that say how to start, not how to train.
NOT_SETTINGS = ("train.resume", "train.init_from")


def load_state(cfg: Config, dist: DistInfo, ckpts: RunFolder) -> tuple[dict | None, str | None]:
    """The training state to continue from, per train.resume, on every rank, and its path;
    (None, None) for a fresh run. Rank 0 decides, holding the run folder's lock, and every
    rank reads that one file: if ranks chose on their own, one failed read (or a node without
    the shared filesystem) would leave them at different steps. Any rank's failure stops every
    rank with one line."""
    found, error = None, None
    if dist.is_main:
        try:
            if ckpts.run_dir.exists():
                ckpts.lock()  # before reading: a live run may still be writing here
            found = ckpts.find(cfg.train.resume, cfg.run.name)
        except UserError as exc:
            error = exc
    path, error = distributed.broadcast_object((str(found[1]) if found else None, error))
    if error is not None:
        raise error
    if path is None:
        return None, None
    state, problem = found[0] if found else None, None
    if state is None:
        try:
            state = files.check_training_state(files.load(path), path)
        except UserError as exc:
            problem = str(exc)
    for rank, failure in enumerate(distributed.all_gather_object(problem)):
        if failure:
            raise CheckpointError(f"rank {rank} cannot read the checkpoint to resume: {failure}")
    return state, path


def changes(state: dict, cfg: Config) -> list[str]:
    """The settings that differ from the checkpoint's, as "key old -> new"; refuses FIXED ones.
    Everything else applies from the resumed step on (see optim.continue_schedule)."""
    old, new = flatten(state["config"]), flatten(to_dict(cfg))
    out = []
    for key, value in new.items():
        if key in NOT_SETTINGS or key not in old or old[key] == value:
            continue
        if key in FIXED:
            raise ConfigError(
                f"{key}={value} differs from the checkpoint's {old[key]}; a resumed run keeps "
                f"it: drop the override, or start a new run (run.name=<new name>)"
            )
        out.append(f"{key} {old[key]} -> {value}")
    return out


def complete_reason(cfg: Config, progress: Progress) -> str | None:
    """Why nothing is left to train ("finished": every epoch, "max_steps", "early_stopping"),
    or None while something is. Early stopping is judged with this run's patience: a larger
    one continues an early-stopped run."""
    if progress.epoch >= cfg.train.epochs:
        return "finished"
    if 0 < cfg.train.max_steps <= progress.step:
        return "max_steps"
    if 0 < cfg.train.early_stop_patience <= progress.bad_epochs:
        return "early_stopping"
    return None
