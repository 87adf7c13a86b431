"""A run folder and its checkpoints: <run.output_dir>/<run.name>/ holds step-00001234.pt
(the newest `keep_last`), last.pt and best.pt (hard links to step files, so they cost no
space), config.yaml, metrics.csv, tb/ and .lock (held by the process that trains the run).
# >>> fsdp
Under train.strategy=fsdp each step file has a folder of shards beside it, step-00001234.dcp/
(see sharded.py), kept while a checkpoint file names it.
# <<< fsdp

RunFolder saves with keep-last-k, chooses what train.resume continues from, and holds the
lock; what a checkpoint holds and how it is read and written is files.py's.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..utils import locks
from ..utils.run_files import BEST, LAST, RUN_LOCK, SET_ASIDE, STEP_FILE, step_file
from . import files

# What going without the folder lock risks (a filesystem without locks).
UNLOCKED_RUN = "two processes training the same run would not be stopped"


class RunFolder:
    """A run folder's checkpoints: saving with keep-last-k, choosing what to resume from, and
    the lock that keeps a second process out of the folder."""

    def __init__(self, run_dir: Path, keep_last: int):
        self.run_dir, self.keep_last = run_dir, keep_last
        self._lock_fd: int | None = None
        self._lock_id: tuple[int, int] | None = None  # (device, inode) of the file locked

    def step_files(self) -> list[Path]:
        """The step checkpoints, newest first: step-<8 digits>.pt only, not files the tools
        write beside them (step-N.<what>.pt), which pruning would delete and a resume would
        try."""
        found = self.run_dir.glob("step-*.pt")
        return sorted((p for p in found if STEP_FILE.fullmatch(p.name)), reverse=True)

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint of the run, loadable or not (files set aside as *.bad included)."""
        aside = self.run_dir.glob(f"step-*.pt{SET_ASIDE}")
        bad = [p for p in aside if STEP_FILE.fullmatch(p.stem)]
        ends = [self.run_dir / name for name in (LAST, BEST)]
        return [*self.step_files()[::-1], *sorted(bad), *(p for p in ends if p.exists())]

    def save(self, state: dict, step: int, is_best: bool, record=None) -> Path:
        """Save `state` as step `step`'s file (and last.pt, best.pt), keep the newest
        keep_last. `record()` (writes the epoch's metrics row) runs between the file's bytes
        and its name: a kill in between leaves a row past the newest checkpoint, which a
        resume drops and logs again (a row after the name would be lost for good), and a
        failed write of the file leaves the record as it was."""
        problem = self.lost()
        if problem:  # never recreate a folder this process no longer holds
            raise CheckpointError(problem)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / step_file(step)
        files.atomic_save(state, path, before_rename=record)
        _atomic_link(path, self.run_dir / LAST)
        if is_best:
            _atomic_link(path, self.run_dir / BEST)
        for old in self.step_files()[self.keep_last :]:
            old.unlink(missing_ok=True)  # best.pt is its own link: pruning keeps its data
        self._prune_shards()  # feature: fsdp
        return path

    # >>> fsdp
    def _prune_shards(self) -> None:
        """Remove the shard folders (train.strategy=fsdp) that no checkpoint file names."""
        folders = list(self.run_dir.glob("step-*.dcp"))
        if not folders:
            return
        named = {path.with_suffix(".dcp").name for path in self.step_files()}
        for link in (LAST, BEST):  # their step file may be pruned already
            try:
                named.add(Path(files.load(self.run_dir / link)["shards"]).name)
            except (CheckpointError, KeyError):
                if (self.run_dir / link).exists():
                    return  # cannot tell which folder it needs: keep them all
        for folder in folders:
            if folder.name not in named:
                shutil.rmtree(folder, ignore_errors=True)
    # <<< fsdp

    def find(self, resume: str, say=print) -> tuple[dict, Path] | None:
        """What train.resume asks to continue from: "" nothing (a fresh run, refused where the
        run has checkpoints); "auto" the newest checkpoint that loads, nothing where the
        folder has none, an error where it has some and none loads; else the path given."""
        name = self.run_dir.name  # run.name
        if resume == "auto":
            found = self.latest(warn=say, quarantine=True)
            if found is None and self.checkpoint_files():
                names = ", ".join(path.name for path in self.checkpoint_files())
                raise CheckpointError(
                    f"no checkpoint of run {name!r} loads ({names} in {self.run_dir}); "
                    "resume from a good file with train.resume=PATH, or start a new run with "
                    "run.name=<new name>"
                )
            if found is None:
                say(f"train.resume=auto: no checkpoint in {self.run_dir}, starting fresh")
            return found
        if resume:
            state = files.check_training_state(files.load(resume), resume)
            if not self.holds(resume, state) and self.checkpoint_files():
                # Continuing it here would replace this run's lineage and prune its files.
                raise ConfigError(
                    f"run {name!r} already exists in {self.run_dir}, and "
                    f"train.resume={resume} is not one of its checkpoints; continue that "
                    "checkpoint as a new run with run.name=<new name>, or this run with "
                    "train.resume=auto"
                )
            return state, Path(resume)
        if self.checkpoint_files():
            raise ConfigError(
                f"run {name!r} already exists in {self.run_dir}; continue it with "
                "train.resume=auto, or start a new one with run.name=<new name>"
            )
        return None

    def holds(self, path: str | Path, state: dict) -> bool:
        """Whether the checkpoint `path` (holding `state`) is this run's: a file in this
        folder, or one whose saved settings name this run folder (a copy kept elsewhere)."""
        here = self.run_dir.resolve()
        if Path(path).resolve().parent == here:
            return True
        run = state.get("config", {}).get("run") or {}
        if not isinstance(run, dict) or not run.get("name"):
            return False
        return (Path(str(run.get("output_dir", ""))) / str(run["name"])).resolve() == here

    def latest(self, warn=print, quarantine=False) -> tuple[dict, Path] | None:
        """Newest checkpoint that loads among the step files, last.pt and best.pt.

        A file whose bytes are not a checkpoint is reported and the next one tried; with
        `quarantine` a step file that fails so is renamed *.bad (kept for a look, out of the
        way of pruning). Any other failure (I/O, memory) stops here and renames nothing:
        falling back to an older file would lose the newer one's work at the next prune."""
        tried = set()
        for path in [*self.step_files(), self.run_dir / LAST, self.run_dir / BEST]:
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if (stat.st_dev, stat.st_ino) in tried:  # last.pt and best.pt link to step files
                continue
            tried.add((stat.st_dev, stat.st_ino))
            try:
                return files.check_training_state(files.load(path), path), path
            except files.CorruptCheckpoint as exc:
                warn(f"warning: skipping {exc}")
                if quarantine and path.name.startswith("step-"):
                    path.rename(path.with_name(path.name + SET_ASIDE))
                    # >>> fsdp
                    shards = path.with_suffix(".dcp")  # fsdp: its shards go aside with it
                    if shards.is_dir():
                        shards.rename(shards.with_name(shards.name + SET_ASIDE))
                    # <<< fsdp
        return None

    def lock(self) -> None:
        """Hold the run folder for this process: a second one (a duplicate job, a resume while
        the run still trains) gets one line instead of a race over the same files. The OS
        releases the lock when the process ends, by kill -9 too: no stale lock is left."""
        if self._lock_fd is not None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / RUN_LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locks.lock(fd, path, UNLOCKED_RUN, wait=False)
        except BlockingIOError:  # only this means held; no locks at all is warned about
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run folder {str(self.run_dir)!r} is in use ({holder}); wait for that run to "
                "end or stop it, or choose another run.name"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"held by pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        stat = os.fstat(fd)
        self._lock_fd, self._lock_id = fd, (stat.st_dev, stat.st_ino)

    def lost(self) -> str | None:
        """Why this process no longer holds its run folder (the folder or its lock file
        removed, moved or replaced since it was locked), or None: while it holds it, or
        holds no lock. A lock on a deleted file keeps nobody out, so a second process may
        have taken the path since: nothing more may be written there."""
        if self._lock_fd is None:
            return None
        try:
            stat = os.stat(self.run_dir / RUN_LOCK)
            if (stat.st_dev, stat.st_ino) == self._lock_id:
                return None
        except OSError:  # gone, or a part of the path is no folder now
            pass
        return (
            f"run folder {str(self.run_dir)!r} was removed, moved or replaced while this run "
            "trained (its .lock is not the one this run holds); stopped without writing "
            "there. Restore the folder and resume with train.resume=auto, or start again"
        )

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = self._lock_id = None

    def remove_stale_temporaries(self) -> None:
        """What a process killed mid-write left in the run folder (a checkpoint, a shard  # feature: fsdp
        folder, a record; never read: the rename never ran), by the one rule every writer's  # feature: fsdp
        """What a process killed mid-write left in the run folder (a checkpoint, a  # feature: !fsdp
        record; never read: the rename never ran), by the one rule every writer's  # feature: !fsdp
        temporaries follow (locks.remove_stale): only those whose process is gone, so a tool
        writing into the run folder now (a report, say) keeps its own."""
        locks.remove_stale(self.run_dir)


def _atomic_link(target: Path, link: Path) -> None:
    tmp = locks.temporary(link)
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:  # a filesystem without hard links: copy instead
        shutil.copyfile(target, tmp)
    os.replace(tmp, link)
