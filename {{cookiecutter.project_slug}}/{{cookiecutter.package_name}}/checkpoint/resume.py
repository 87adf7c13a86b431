"""Continuing a run: which checkpoint (rank 0 chooses, every rank reads the same file), what
changed since it was saved, and whether anything is left to train."""

from __future__ import annotations

import dataclasses

from .. import distributed, finetune
from ..config import Config, TrainConfig, flatten, to_dict
from ..data import set_epoch
from ..distributed import DistInfo
from ..errors import LEFT_OUT, CheckpointError, ConfigError, UserError, left_out
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
    "data.sampler",  # another draw of the epochs left: refused, not a silent fork
    "model.name",
    "task.name",
    "task.class_weights",  # the loss trained on
    "task.pos_weight",  # feature: multilabel
)
# Settings that say how to start, not how to train.
NOT_SETTINGS = ("train.resume", "train.init_from")
# What a run continued as a new one (another run's checkpoint) starts afresh: its own best.pt
# is chosen among its own validations (the earlier best's file stays in the other folder).
FRESH_BEST = {"best": None, "best_epoch": None, "best_tie": None, "bad_epochs": 0}


def load_state(resume: str, dist: DistInfo, ckpts: RunFolder) -> tuple[dict | None, str | None]:
    """The training state to continue from, per `resume` (train.resume), on every rank, and
    its path; (None, None) for a fresh run. Rank 0 decides, holding the run folder's lock,
    and every rank reads that one file: if ranks chose on their own, one failed read (or a
    node without the shared filesystem) would leave them at different steps. Any rank's
    failure stops every rank with one line."""
    found, error = None, None
    if dist.is_main:
        try:
            if ckpts.run_dir.exists():
                ckpts.lock()  # before reading: a live run may still be writing here
            found = ckpts.find(resume)
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


def changes(state: dict, cfg: Config, path: str | None = None) -> list[str]:
    """The settings that differ from the checkpoint's, as "key old -> new"; refuses FIXED ones,
    and for the same run (`path`: its checkpoint; None for a checkpoint continued as a new
    run) another best metric. Everything else applies from the resumed step on (see
    optim.continue_schedule)."""
    old, new = _grouped(flatten(state["config"])), _grouped(flatten(to_dict(cfg)))
    out = []
    for key, value in new.items():
        if key in NOT_SETTINGS or key not in old or old[key] == value:
            continue
        if f"{key}={old[key]}" in LEFT_OUT:  # a fuller project's run: name what it needs
            raise ConfigError(left_out(f"{key}={old[key]}", f"the checkpoint's {key}={old[key]}"))
        if key in FIXED:
            raise ConfigError(
                f"{key}={value} differs from the checkpoint's {old[key]}; a resumed run keeps "
                f"it: set {key}={old[key]} (as the run's config.yaml does), or start a new "
                "run (run.name=<new name>)"
            )
        out.append(f"{key} {old[key]} -> {value}")
    check_finetune_terms(state, cfg)
    if path is not None:
        check_best_terms(state, cfg, path)
    return out


def check_finetune_terms(state: dict, cfg: Config) -> None:
    """The optimizer's groups set head and backbone apart when the run fine-tunes
    (finetune.used): a resume cannot turn that on or off, only change its values."""
    saved = state["config"].get("train", {})
    keys = ("freeze_epochs", "backbone_lr_ratio", "bn_frozen")
    before = dataclasses.replace(cfg.train, **{k: saved[k] for k in keys if k in saved})
    if finetune.used(before) != finetune.used(cfg.train):
        now, then = ("sets", "did not") if finetune.used(cfg.train) else ("does not set", "did")
        raise ConfigError(
            f"this run {now} head and backbone apart (train.freeze_epochs, backbone_lr_ratio, "
            f"bn_frozen) and the run it resumes {then}, which a resume cannot change: keep "
            "the checkpoint's values (its config.yaml), or start a new run from its weights "
            "(run.name=<new name> train.init_from=<its checkpoint>)"
        )


def _grouped(flat: dict) -> dict:
    """Dotted settings with a FIXED mapping (task.class_weights by class name) as one value:
    flatten() spreads it over keys that a change from or to a list would not compare."""
    out = {}
    for key, value in flat.items():
        head = next((f for f in FIXED if key.startswith(f"{f}.")), None)
        if head is None:
            out[key] = value
        else:
            out.setdefault(head, {})[key.removeprefix(f"{head}.")] = value
    return out


def check_best_terms(state: dict, cfg: Config, path: str) -> None:
    """Refuse another train.best_metric or best_mode (as resolved from "auto") on resume:
    best.pt, the best value, its tie and early stopping's count are the old metric's, and
    best.pt cannot be chosen again once the other epochs' files are pruned."""
    old = state["config"].get("train", {})
    terms = {k: old.get(k, "auto") for k in ("best_metric", "best_mode")}
    try:
        before = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **terms)).best()
    except KeyError:  # a metric this task no longer has: not the one chosen now
        before = (terms["best_metric"], terms["best_mode"])
    if before != cfg.best():
        raise ConfigError(
            f"train.best_metric/best_mode pick val {cfg.best()[0]} ({cfg.best()[1]}) now, but "
            f"this run's best.pt, best value and early-stopping count are of val {before[0]} "
            f"({before[1]}); drop the override, or continue the checkpoint as a new run that "
            f"picks its own best: run.name=<new name> train.resume={path}"
        )


def check_position(progress: Progress, data, path: str) -> None:
    """Refuse a mid-epoch resume that has no batch left of its epoch in `data` (loop.Data):
    training data smaller than the saved position (a table or tensor file that shrank), or a
    larger batch than the part left. Going on would end the epoch untrained and log a loss
    of nothing. Leaves the loader at the saved position, where the epoch loop sets it too."""
    if not progress.epoch_samples:
        return
    set_epoch(data.train_loader, progress.epoch, start=progress.epoch_samples)
    if len(data.train_loader):
        return
    train_size, batch = len(data.train_set), data.effective_batch
    where = f"sample {progress.epoch_samples} of epoch {progress.epoch + 1}"
    if progress.epoch_samples >= train_size:
        raise ConfigError(
            f"the checkpoint stopped at {where}, beyond the {train_size} training samples "
            "there are now: the training data changed; resume on the data it was trained "
            f"with, or start a new run from its weights (run.name=<new name> "
            f"train.init_from={path})"
        )
    raise ConfigError(
        f"the checkpoint stopped at {where}, and less than one batch ({batch} "
        f"samples) of its {train_size} is left; resume with the batch size it was saved with "
        "until the epoch ends, then change it"
    )


def complete_reason(train: TrainConfig, progress: Progress) -> str | None:
    """Why nothing is left to train ("finished": every epoch, "max_steps", "early_stopping"),
    or None while something is. Early stopping is judged with this run's patience: a larger
    one continues an early-stopped run."""
    if progress.epoch >= train.epochs:
        return "finished"
    if 0 < train.max_steps <= progress.step:
        return "max_steps"
    if 0 < train.early_stop_patience <= progress.bad_epochs:
        return "early_stopping"
    return None
