"""Sharded checkpoints (train.strategy=fsdp): save, restore, consolidate.

A sharded checkpoint has two parts: step-N.dcp/, the model and optimizer written by
torch.distributed.checkpoint (one file per rank plus .metadata), and step-N.pt, the usual
checkpoint file without them, naming the folder. The folder is written under a temporary name
and renamed, then rank 0 writes step-N.pt (run_folder.py): the checkpoint exists once that
file does, so a crash mid-save leaves the previous one loadable. A different world size reads
the same folder (DCP reshards); scripts/consolidate.py writes the full model to one file.

DCP is imported inside the functions that use it: at the top of this file it costs every run
about a second of start-up, fsdp or not.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import distributed
from ..errors import CheckpointError, first_line
from ..fsdp import is_sharded
from ..utils.locks import temporary
from . import files


def save_shards(model: nn.Module, optimizer, run_dir: Path, step: int) -> str | None:
    """Under fsdp, every rank writes its shards of the model and optimizer to
    run_dir/step-N.dcp (a collective: every rank calls it). Returns the folder's name for the
    checkpoint file to hold; None (and nothing written) when the model is not sharded."""
    if not is_sharded(model):
        return None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = f"step-{step:08d}.dcp"
    # Rank 0's temporary (its pid in the name, as every writer's: utils/locks.py), the same
    # folder for every rank.
    final = run_dir / name
    tmp = Path(distributed.broadcast_object(str(temporary(final))))
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    # BatchNorm statistics differ per rank; every rank saves and validates with rank 0's.
    distributed.sync_buffers(model)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    distributed.barrier()  # the folder exists before any rank writes into it
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    distributed.barrier()  # every rank's file is written before the folder is renamed
    if dist.get_rank() == 0:
        _replace_folder(tmp, final)
    return name


def restore(state: dict, model: nn.Module, optimizer, strategy: str) -> None:
    """Load the model and optimizer of a sharded checkpoint (a collective); nothing for a full
    one, which state.restore_training_state loads. A sharded checkpoint resumes under
    either strategy and on any number of ranks: each rank reads the parts it holds."""
    if "shards" not in state:
        if strategy == "fsdp":
            raise CheckpointError(
                "the checkpoint to resume holds a full (ddp) training state; resume it with "
                "train.strategy=ddp, or start an fsdp run from its weights with "
                "train.init_from=<that file>"
            )
        return
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        _read({"model": model_state, "optimizer": optimizer_state}, state["shards"])
    except CheckpointError:  # a shard file that holds code: refused as it is
        raise
    except Exception as exc:  # _read: every rank's failure, gathered by DCP
        if _damaged(exc):  # bytes overwritten at full length: the size check cannot see it
            raise CheckpointError(
                f"sharded checkpoint {state['shards']!r} has a damaged shard file "
                f"({first_line(exc, 120)}); rename it and its step-N.pt aside to resume from "
                "the previous checkpoint"
            ) from None
        raise CheckpointError(
            f"sharded checkpoint {state['shards']!r} does not load into this run "
            f"({first_line(exc, 200)}); use the model.* settings it was trained with"
        ) from None
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state
    )


def consolidate(path: str | Path, out: str | Path | None = None, before_rename=None) -> Path:
    """Write the full model of the sharded checkpoint `path` (its step-N.pt, last.pt or
    best.pt) to one plain file, with its config and progress, for scripts/evaluate.py and
    train.init_from. Runs in one process, no process group; holds the full model in memory
    (not the optimizer). Returns the file written: `out`, or <name>.full.pt beside `path`.
    `before_rename`: files.atomic_save's."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .shard_reader import read_index

    path = Path(path)
    head = files.load(path)
    if "shards" not in head:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a single file already (not sharded); use it as it is"
        )
    tensors = read_index(head["shards"]).state_dict_metadata
    model = {
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in tensors.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    try:
        _read({"model": model}, head["shards"])
    except RuntimeError as exc:
        raise CheckpointError(
            f"sharded checkpoint {head['shards']!r} could not be read ({first_line(exc, 200)}); "
            "consolidate an earlier step-N.pt of the run"
        ) from None
    out = Path(out) if out else path.with_name(f"{path.stem}.full.pt")
    meta = {**head.get("meta", {}), "consolidated_from": str(path)}
    full = {"model": model, "config": head["config"], "progress": head["progress"], "meta": meta}
    # What the tools read besides the weights: preprocessing, shapes.
    full.update({key: head[key] for key in ("data", "io") if key in head})
    files.atomic_save(full, out, before_rename)
    return out


def _read(state: dict, folder: str) -> None:
    """Fill `state` in place from the shard folder; each rank reads what its tensors hold. On
    one process without a group (ddp, consolidation) it reads everything. A failure comes back
    as a RuntimeError (DCP's CheckpointException is no Exception: `except Exception` misses
    it), with the first failing rank's reason; a file that holds code as a CheckpointError.
    Without a group DCP reads in this one process (torch 2.6 has no no_dist= to say so)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from . import shard_reader

    try:
        with warnings.catch_warnings():  # DCP warns that no group is running: here it is meant
            warnings.filterwarnings("ignore", "torch.distributed is ", UserWarning)
            shard_reader.load(state, folder)
    except CheckpointException as exc:
        failures = list(getattr(exc, "failures", {}).values())
        first = failures[0] if failures else exc
        first = first[0] if isinstance(first, tuple) else first  # (exception, traceback)
        raise RuntimeError(f"{type(first).__name__}: {first_line(first, 160)}") from None


# What reading a shard whose bytes are not what DCP wrote raises (as _read names it), as
# opposed to a model that does not match (missing keys, other sizes).
_DAMAGE = ("UnpicklingError", "EOFError", "BadZipFile", "Weights only load failed",
           "PytorchStreamReader")  # fmt: skip


def _damaged(exc: Exception) -> bool:
    return any(sign in str(exc) for sign in _DAMAGE)


def _replace_folder(tmp: Path, final: Path) -> None:
    # Renaming a folder over a non-empty one fails: set an existing one (a save at the step
    # just resumed from) aside first. Only the step-N.pt file written next refers to it.
    old = tmp.with_name(f"{tmp.name}.old")  # removed by locks.remove_stale if left
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    files.fsync_dir(final.parent)
