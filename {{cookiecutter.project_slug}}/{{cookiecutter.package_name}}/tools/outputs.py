"""Where a tool may write: the one rule for every tool's output (each script's --out, and
evaluate.py --report), and the clean-up of what a tool killed mid-write left beside its target.

- Never over a run: a checkpoint (step-N.pt, last.pt, best.pt, *.pt.bad inside a run
  folder, an existing training checkpoint anywhere, what a step-N.dcp/ folder holds) or a  # feature: fsdp
  folder, an existing training checkpoint anywhere) or a  # feature: !fsdp
  record of a run or output folder (config.yaml, metrics.csv, runs.csv, curves.png,
  *.damaged, the locks, tb/, a tool's own records ...: utils/run_files.py lists them).
  --force does not change that.
- Never over one of the command's own inputs, by any name (a symlink, a hard link).
- An existing file is replaced only where it is the tool's own earlier output of the same
  kind (`own`, which each tool passes: a prediction CSV, a compare plot, an evaluation
  report ...), or with --force.

Each refusal is one UserError naming the path and the fix, raised before anything is written.
A tool writes through a hidden temporary beside its target, `.<name>.tmp<pid>` (a file, or a
staging folder); one left by a killed process is removed by the next start (remove_stale).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import UserError
from ..utils import locks
from ..utils import run_files as names

# The names come from utils/run_files.py, where the code that writes each file takes them too.
CHECKPOINT = re.compile(
    rf"({names.STEP_FILE.pattern})({re.escape(names.SET_ASIDE)})?"
    rf"|{re.escape(names.LAST)}|{re.escape(names.BEST)}"
)
SHARDS = re.compile(rf"({names.SHARD_FOLDER.pattern})({re.escape(names.SET_ASIDE)})?")  # feature: fsdp
# Records no other file is named like: refused wherever they are.
RECORD = re.compile("|".join(names.PROTECTED))
# Folders all of whose content is a run's (or its tool's).
TRACKER_FOLDERS = tuple(names.OWNED_FOLDERS)
# Records with common names: refused inside a run or output folder (MARKS).
FOLDER_RECORD = re.compile("|".join(map(re.escape, [*names.RECORDS, *TRACKER_FOLDERS])))
# A folder holding one of these is a run folder (config.yaml, .lock, step files) or an output
# folder (runs.csv, a tool's own records).
MARKS = tuple(names.MARKS)


def is_run_area(folder: Path) -> bool:
    """Whether `folder` is a run or output folder (it holds one of their records, or
    a step checkpoint: last.pt and best.pt are names anyone may give a file)."""
    if any((folder / mark).exists() for mark in MARKS):
        return True
    try:
        return any(names.STEP_FILE.fullmatch(entry.name) for entry in os.scandir(folder))
    except OSError:  # not there (yet), not a folder, not readable
        return False


def training_checkpoint(path: Path) -> bool:
    """Whether the existing file `path` is a checkpoint that training saved (it holds the
    optimizer's state, or names its shards): memory-mapped, so a large one is not read."""  # feature: fsdp
    optimizer's state): memory-mapped, so a large one is not read."""  # feature: !fsdp
    if not path.is_file():
        return False
    import torch  # only here: most tools' outputs are checked without it

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch file, truncated, pickled objects: no training checkpoint
        return False
    return isinstance(state, dict) and ("optimizer" in state or "shards" in state)  # feature: fsdp
    return isinstance(state, dict) and "optimizer" in state  # feature: !fsdp


def run_file(path: Path) -> str | None:
    """What `path` is to a run when it is a checkpoint or a record of one (existing or not):
    a phrase for the error line; None for any other path."""
    name, folder = path.name, path.parent
    # A checkpoint's name is a run's inside a run folder; elsewhere (deploy/best.pt) only an
    # existing training checkpoint is.
    if CHECKPOINT.fullmatch(name) and (is_run_area(folder) or training_checkpoint(path)):
        return f"a checkpoint of a run ({name})"
    # >>> fsdp
    if SHARDS.fullmatch(name) or any(SHARDS.fullmatch(p.name) for p in path.parents):
        return "a checkpoint's shard folder or inside one"
    # <<< fsdp
    if RECORD.fullmatch(name):
        return f"a record of a run ({name})"
    if FOLDER_RECORD.fullmatch(name) and is_run_area(folder):
        return f"a record of the run folder {str(folder)!r} ({name})"
    for inner in path.parents:
        if inner.name in TRACKER_FOLDERS and is_run_area(inner.parent):
            return f"inside the run folder's {inner.name}/"
    if is_run_area(path):
        return "a run or output folder"
    return None


def refuse_run_file(path: Path, option: str) -> None:
    """One line, whatever --force says, where `path` (or what it links to) is a run's file."""
    for candidate in dict.fromkeys([path, path.resolve()]):
        what = run_file(candidate)
        if what:
            raise UserError(
                f"{option} {str(path)!r} is {what}; a tool never writes over a run's "
                f"checkpoints and records: choose another {option}"
            )


def refuse_input(path: Path, inputs: Iterable, option: str) -> None:
    """One line where `path` is one of the command's inputs by any name (the same file
    through a symlink or a hard link), or an existing file inside an input folder."""
    if not path.exists():
        return  # not there: it can be no input
    for given in inputs:
        source = Path(given)
        try:
            same = source.exists() and os.path.samefile(path, source)
            inside = source.is_dir() and path.resolve().is_relative_to(source.resolve())
        except OSError:
            continue
        if same or inside:
            raise UserError(
                f"{option} {str(path)!r} is one of this command's inputs ({str(given)!r}); "
                f"choose another {option}"
            )


def check_out(
    path: Path,
    inputs: Iterable = (),
    own: Callable[[Path], bool] | None = None,
    force: bool = False,
    option: str = "--out",
) -> Path:
    """`path` if the tool may write it (the rule above), else one UserError; also removes
    the temporaries that a killed process left beside it."""
    refuse_run_file(path, option)
    refuse_input(path, list(inputs), option)
    if path.is_dir():
        raise UserError(f"{option} {str(path)!r} is a folder; give a file name")
    if (path.exists() or path.is_symlink()) and not force and not (own and own(path)):
        raise UserError(
            f"{option} {str(path)!r} exists and is not an earlier output of this tool; "
            f"choose another {option}, or pass --force to replace it"
        )
    remove_stale(path)
    return path


def staging(target: Path) -> Path:
    """This process's hidden temporary beside `target` (remove_stale knows the name)."""
    return locks.temporary(target)


def remove_stale(target: Path) -> list[Path]:
    """Remove what a killed tool left beside `target`: `.<name>.tmp<pid>` files and folders
    (and `.tmp<pid>.old`) whose process is gone (utils/locks.py: the rule training's own
    temporaries follow too). Another live process's are kept, and so is every other file.
    Returns what was removed."""
    return locks.remove_stale(target.parent, target.name)
