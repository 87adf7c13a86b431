"""Checkpointing, in one place: the trainer and the loop call a CheckpointManager and nothing
else; the tools (evaluate, predict, ...) read checkpoints with load().

    ckpt = CheckpointManager(run_dir, keep_last, dist, settings)  # <run.output_dir>/<run.name>/
    state, path = ckpt.find(resume)       # what train.resume continues from, on every rank
    changed = changes(state, cfg, path)   # the settings changed since (some are refused)
    ckpt.restore(state, trainee, progress, data, train, model_name)
    ckpt.open()                           # rank 0: the lock, leftovers of a kill
    ckpt.write_config(record, diff)       # rank 0: config.yaml, run.json (resumed: 1st save)
    ckpt.check_held()                     # the run folder is still this run's (every rank)
    ckpt.save(trainee, progress, extra, is_best, record)   # every epoch and at a stop
    ckpt.close()

The modules inside: files.py (the .pt file: atomic writing, safe reading, what a training
checkpoint must hold), state.py (Progress, the training state built and restored, weights),
run_folder.py (step files, keep-last-k, last.pt/best.pt, choosing the newest loadable, the
lock) and resume.py (rank 0 chooses, settings a resume may not change, a finished run).
sharded.py (train.strategy=fsdp): the model and optimizer as DCP shards beside the file.  # feature: fsdp
"""

from __future__ import annotations

from pathlib import Path

from .. import distributed, finetune
from ..config import TrainConfig, save_config
from ..data import check_split
from ..distributed import DistInfo
from ..errors import CheckpointError
from ..utils import provenance
from ..utils.seed import rng_state
from . import sharded  # feature: fsdp
from .files import (
    CorruptCheckpoint,
    atomic_save,
    check_training_state,
    fsync_dir,
    is_bare_weights,
    load,
    model_weights,
)
from .resume import (
    FRESH_BEST,
    changes,
    check_position,
    complete_reason,
    load_state,
)
from .run_folder import RunFolder
from .sharded import consolidate  # feature: fsdp
from .state import (
    Progress,
    init_from,
    load_model_state,
    note_batch_change,
    restore_training_state,
    strip_prefixes,
    training_state,
)

__all__ = [
    "CheckpointManager",
    "CorruptCheckpoint",
    "Progress",
    "RunFolder",
    "atomic_save",
    "changes",
    "check_training_state",
    "complete_reason",
    "consolidate",  # feature: fsdp
    "fsync_dir",
    "init_from",
    "is_bare_weights",
    "load",
    "load_model_state",
    "model_weights",
    "strip_prefixes",
]


class CheckpointManager:
    """One run's checkpoints: where they live, which one a resume continues from, restoring it
    into the objects being trained, and saving them (sharded under fsdp) with keep-last-k.  # feature: fsdp
    into the objects being trained, and saving them with keep-last-k.  # feature: !fsdp

    `trainee` is anything with model, optimizer, scheduler and scaler (loop.Trainee); `data`
    anything with meta and effective_batch (loop.Data)."""

    def __init__(self, run_dir: Path, keep_last: int, dist: DistInfo, settings: dict):
        """`settings`: the run's config as config.yaml holds it (config.to_dict), written
        into every checkpoint and beside them."""
        self.dist, self.settings = dist, settings
        self.folder = RunFolder(run_dir, keep_last)
        self._config_due = False  # config.yaml, run.json wait for a resumed run's first save
        self.resumed_from: str | None = None
        self.new_run = False  # continues another run's checkpoint as this new run
        self.record: dict | None = None  # rank 0's run.json, kept in each checkpoint's meta
        self._diff = ""  # the uncommitted changes, diff.patch beside it

    @property
    def run_dir(self) -> Path:
        return self.folder.run_dir

    def find(self, resume: str) -> tuple[dict | None, str | None]:
        """The training state `resume` (train.resume) asks to continue from, read on every
        rank, and its path; (None, None) for a fresh run. Refuses to overwrite a run that has
        checkpoints: a fresh start, or another run's checkpoint (continued as a new run only)."""
        state, path = load_state(resume, self.dist, self.folder)
        self._config_due, self.resumed_from = path is not None, path
        self.new_run = state is not None and not self.folder.holds(path, state)
        if self.new_run:
            # Its own best and tracker runs: the earlier ones belong to the other run.
            state["progress"] = {**state["progress"], **FRESH_BEST}
            state.pop("trackers", None)
            if self.dist.is_main:
                print(
                    f"train.resume={path}: another run's checkpoint, continued as the new run "
                    f"{self.run_dir.name!r} (its metrics.csv starts here; best.pt and early "
                    "stopping count from its first validation)"
                )
        return state, path

    def restore(
        self, state: dict, trainee, progress: Progress, data, train: TrainConfig, model_name: str
    ) -> None:
        """Continue the run of `state` exactly (a collective under fsdp): the same validation  # feature: fsdp
        """Continue the run of `state` exactly: the same validation  # feature: !fsdp
        rows, every state restored (resume.changes checks the settings first)."""
        if data.meta.get("split"):  # the same validation rows as before the stop
            fix = "resume on the same data, or start a new run (run.name=<new name>)"
            check_split(data.meta["split"], state.get("data"), fix)
        t, dist = trainee, self.dist
        # The backbone frozen or not as when saved: the optimizer's state is for exactly the
        # parameters that train (a frozen one has none yet).
        finetune.set_epoch(t.model, train, state["progress"]["epoch"], model_name)
        sharded.restore(state, t.model, t.optimizer, train.strategy)  # feature: fsdp
        restore_training_state(
            state,
            t.model,
            t.optimizer,
            t.scheduler,
            t.scaler,
            progress,
            dist.rank,
            dist.world_size,
        )
        if t.ema is not None and "ema" in state:  # else it starts from the weights resumed
            t.ema.load_state_dict(state["ema"])
        check_position(progress, data, self.resumed_from)
        if dist.is_main:
            note_batch_change(state, data.effective_batch)

    def open(self) -> None:
        """Rank 0 takes the run folder before writing to it: the lock, and the temporary files
        of a run killed mid-save removed."""
        self.folder.lock()
        self.folder.remove_stale_temporaries()

    def write_config(self, record: dict, diff: str) -> None:
        """Rank 0: config.yaml, the settings the run's checkpoints were trained with, and
        run.json (and diff.patch), what made the run: code, software, machine, launcher, data
        digests (`record`, `diff`: utils/provenance.collect). Written now for a new run; for a
        resumed one with its first checkpoint, so a resume that fails (a refused setting, a
        full disk, a first step that fails) leaves both files as they were."""
        self.record, self._diff = record, diff
        if not self._config_due or not (self.run_dir / "config.yaml").is_file():
            self._write_config()

    def _write_config(self) -> None:
        save_config(self.settings, self.run_dir / "config.yaml")
        provenance.write(self.run_dir, self.record, self._diff)  # a resume: appended to
        self._config_due = False

    def check_held(self) -> None:
        """Every rank: stop with one line once rank 0's run folder is no longer the one it
        locked (removed, moved or replaced while the run trained): before each save (whose
        shards every rank writes, with the epoch's metrics row). The run's MetricLogger asks
        lost() itself before it writes there."""
        problem = distributed.broadcast_object(self.lost() if self.dist.is_main else None)
        if problem:
            raise CheckpointError(problem)

    def lost(self) -> str | None:
        """Why this process no longer holds the run folder, or None (RunFolder.lost)."""
        return self.folder.lost()

    def save(self, trainee, progress: Progress, extra: dict, is_best: bool, record=None) -> None:
        """A checkpoint of where the run stands (a collective: every rank calls it); `extra`
        (the data's meta and io, tracker ids) goes into the file as it is. Rank 0 writes, and
        calls `record` (the epoch's metrics row) before the file gets its name."""
        rngs = distributed.all_gather_object(rng_state())
        t = trainee
        shards = sharded.save_shards(t.model, t.optimizer, self.run_dir, progress.step)  # feature: fsdp
        if self.dist.is_main:
            state = training_state(
                t.model,
                t.optimizer,
                t.scheduler,
                t.scaler,
                progress,
                self.settings,
                rngs,
                self.dist.world_size,
                shards,  # feature: fsdp
            )
            if t.ema is not None:  # the average, beside the weights a resume trains on
                state["ema"] = t.ema.state_dict()
            if self.record is not None:
                state["meta"]["record"] = self.record
            self.folder.save({**state, **extra}, progress.step, is_best, record)
            if self._config_due:
                self._write_config()

    def close(self) -> None:
        self.folder.unlock()
