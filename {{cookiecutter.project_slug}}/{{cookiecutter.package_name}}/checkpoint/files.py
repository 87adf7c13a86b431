"""The checkpoint file: crash-safe writing, safe loading, what a file must hold to resume from,
and clear errors for files that are not checkpoints (CorruptCheckpoint: safe to set aside).

A checkpoint holds the model, optimizer, scheduler and scaler states, the Progress (epoch,
step, position inside the epoch, best metric), every rank's RNG streams, the resolved config,
the data's meta (class names, normalisation, the validation split), "io" (the model's input
shape and dtype and output size, so the tools need no data) and metadata (torch
version, git commit, world size); state.py builds and restores it.
Under train.strategy=fsdp the model and optimizer are in a folder of shards beside the file  # feature: fsdp
(sharded.py).  # feature: fsdp
"""

from __future__ import annotations

import errno
import os
import pickle
import zipfile
from pathlib import Path

import torch

from ..ema import weights as ema_weights
from ..errors import CheckpointError, CorruptCheckpoint, first_line, unreadable  # feature: fsdp
from ..errors import CheckpointError, CorruptCheckpoint, first_line, left_out, unreadable  # feature: !fsdp
from ..utils.locks import fsync_dir, temporary

TRAINING_KEYS = ("model", "optimizer", "scheduler", "scaler", "progress", "config")


def check_training_state(state: dict, path: str | Path) -> dict:
    """`state` if it holds what a resume needs, else a CheckpointError saying what it is."""
    if is_bare_weights(state):
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds model weights only, not a training state; "
            f"start a new run from them with train.init_from={path}"
        )
    # >>> fsdp
    # A sharded checkpoint's model and optimizer are in the folder it names (sharded.py).
    sharded = ("model", "optimizer") if isinstance(state.get("shards"), str) else ()
    missing = [key for key in TRAINING_KEYS if key not in state and key not in sharded]
    wrong = [
        key
        for key in ("model", "progress", "config")
        if key not in sharded and not isinstance(state.get(key), dict)
    ]
    # <<< fsdp
    # >>> !fsdp
    missing = [key for key in TRAINING_KEYS if key not in state]
    wrong = [k for k in ("model", "progress", "config") if not isinstance(state.get(k), dict)]
    # <<< !fsdp
    if missing or wrong:
        what = f"no {', '.join(missing)}" if missing else f"its {wrong[0]!r} is not a mapping"
        raise CheckpointError(
            f"checkpoint {str(path)!r} is not a training checkpoint of this project ({what}); "
            f"resume from a file this project saved, or use train.init_from={path}"
        )
    return state


def model_weights(state: dict, path: str | Path) -> dict:
    """The model's state_dict: a training checkpoint's (the weights' average when trained with
    train.ema_decay), or a bare `model.state_dict()` file."""
    if is_bare_weights(state):
        return state
    if isinstance(state.get("ema"), dict):  # train.ema_decay: the average, which was validated
        return ema_weights(state["ema"])
    if isinstance(state.get("model"), dict):
        return state["model"]
    # >>> fsdp
    if "shards" in state:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is sharded (train.strategy=fsdp); write its full model "
            f"to one file with: python scripts/consolidate.py --checkpoint {path}"
        )
    # <<< fsdp
    raise CheckpointError(
        f"checkpoint {str(path)!r} holds no model weights (no 'model' entry, and not a "
        "state_dict of tensors); pass a file saved by training or torch.save(model.state_dict())"
    )


def is_bare_weights(state: dict) -> bool:
    return bool(state) and all(isinstance(value, torch.Tensor) for value in state.values())


def atomic_save(obj, path: Path, before_rename=None) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`.

    A rename within one filesystem is atomic, so a reader (or a run killed at any instant)
    sees either the old complete file or the new complete file, never a truncated one.
    `before_rename()` runs once the bytes are on disk, before the name: if it fails, `path`
    is left as it was (the temporary removed), and a kill in between leaves the temporary
    (locks.remove_stale removes it once its process is gone). A tool passes
    cli.placing_output: a stop from there on waits for the rename."""
    tmp = temporary(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path, mmap: bool = False) -> dict:
    """Read a checkpoint onto the CPU with weights_only=True: tensors and plain containers only,
    never pickled code. Restoring copies each tensor to where its parameter lives, so a file
    saved on any device resumes on any other (and RNG states stay the CPU tensors torch needs).
    `mmap`: the tensors are mapped from the file, not read (their bytes are read only where
    used): for what reads the rest of a checkpoint without its weights.

    Raises CorruptCheckpoint when the bytes are not a checkpoint, CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} not found; check the path")
    try:
        # Only torch's zip format maps (a legacy file is read whole; is_zipfile reads its end).
        mmap = mmap and zipfile.is_zipfile(path)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
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
            raise CheckpointError(unreadable(path, exc)) from None
        raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
    except OSError as exc:
        # torch's zip reader raises EINVAL on a truncated file: the file's fault only if
        # plain reading succeeds. Any other errno (EIO, ESTALE, EACCES...) is the system's.
        if exc.errno == errno.EINVAL and _reads_back(path):
            raise CorruptCheckpoint(_not_a_checkpoint(path, exc)) from None
        raise CheckpointError(unreadable(path, exc)) from None
    except MemoryError as exc:
        raise CheckpointError(unreadable(path, exc)) from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict of state"
        )
    # >>> fsdp
    if isinstance(state.get("shards"), str):  # sharded (sharded.py): the folder beside it
        from .shard_reader import check_folder  # imports DCP: a second of start-up

        state["shards"] = str(check_folder(path, state["shards"]))
    # <<< fsdp
    # >>> !fsdp
    if "shards" in state:
        raise CheckpointError(left_out("shards", f"checkpoint {str(path)!r} is sharded and"))
    # <<< !fsdp
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
