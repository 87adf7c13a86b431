"""Reading a shard folder (torch.distributed.checkpoint) without running code from it.

DCP pickles the folder's index (.metadata) and the entries that are not tensors (the
optimizer's hyperparameters), and torch 2.6-2.13 read both back with plain pickle: a file whose
object reduces to os.system runs its command on load. Here the index is read by an unpickler
that finds only the classes DCP's index is made of, and sets state (pickle's BUILD) only on
new instances of DCP's index dataclasses: BUILD on anything else (a class or function it was
allowed to find, an enum member, a layout: objects the whole process shares) would rewrite
them for the process, so a crafted index could make every Path name another file. The
entries are read with torch.load(weights_only=True), as DCP already reads the tensors.
Anything else is refused with a CheckpointError naming the file. (torch's own weights-only
unpickler, which restricts BUILD the same way, cannot read the index: DCP pickles it with
protocol 4, whose FRAME opcode that unpickler refuses.)

This module imports DCP at the top: import it inside the functions that read a shard folder.
"""

from __future__ import annotations

import importlib
import io
import pathlib
import pickle
import re
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..errors import CheckpointError, CorruptCheckpoint, first_line, holds_code, unreadable

_DCP = "torch.distributed.checkpoint"
# What DCP's index is made of (torch 2.6 to 2.13 write the same: read from their
# metadata.py and filesystem.py, and from the index of real checkpoints), besides the dtypes.
ALLOWED = {
    *(
        (f"{_DCP}.metadata", name)
        for name in (
            "Metadata",
            "StorageMeta",
            "MetadataIndex",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",  # TensorProperties' memory format
        )
    ),
    (f"{_DCP}.filesystem", "_StorageInfo"),  # where each entry's bytes are
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided")
}
# StorageMeta.checkpoint_id is the Path the folder was written to: only a name, so a pure path
# (a PosixPath cannot be built on Windows). Python 3.13 names their module pathlib._local.
_PATHS = {
    "PosixPath": pathlib.PurePosixPath,
    "PurePosixPath": pathlib.PurePosixPath,
    "WindowsPath": pathlib.PureWindowsPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
}


class _Refused(pickle.UnpicklingError):
    """A global the index may not hold; its message is the global's name."""


# The index's own dataclasses: the only objects whose state the index may set (BUILD).
_BUILT = {
    getattr(importlib.import_module(module), name)
    for module, name in ALLOWED
    if module.startswith(_DCP) and not name.startswith("_MEM")
}


class _IndexUnpickler(pickle._Unpickler):  # the Python one: its BUILD can be checked
    dispatch = dict(pickle._Unpickler.dispatch)

    def load_build(self):
        target = self.stack[-2]  # BUILD pops the state; the object is below it
        if type(target) not in _BUILT:
            raise _Refused(f"state set on {type(target).__name__} {_name(target)}")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        # vars(), not getattr(): torch's module __getattr__ imports submodules by name.
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
            return vars(torch)[name]
        if module.split(".")[0] == "pathlib" and name in _PATHS:
            return _PATHS[name]
        raise _Refused(f"{module}.{name}")


def _name(target) -> str:
    return getattr(target, "__qualname__", None) or type(target).__qualname__


def read_index(folder: Path | str, name: str = ".metadata") -> Metadata:
    """The shard folder's index. CheckpointError if it holds code; the errors of pickle (a
    damaged file) and OSError (the system's) otherwise."""
    path = Path(folder) / name
    with open(path, "rb") as f:
        try:
            index = _IndexUnpickler(f).load()
        except _Refused as exc:
            raise CheckpointError(holds_code(path, str(exc))) from None
    if not isinstance(index, Metadata):
        raise pickle.UnpicklingError(f"it holds a {type(index).__name__}, not DCP's index")
    return index


class SafeReader(FileSystemReader):
    """DCP's file reader, reading the index with read_index (the tensors it already reads
    with weights_only=True). `refused`: the refusal, which DCP wraps in its own errors."""

    refused: CheckpointError | None = None

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")  # newer torch: a rank's own index (saved uncoordinated)
        try:
            index = read_index(self.path, ".metadata" if rank is None else f"__{rank}.metadata")
        except CheckpointError as exc:
            self.refused = exc
            raise
        if getattr(index, "storage_meta", None) is None:  # as FileSystemReader does
            index.storage_meta = StorageMeta()
        index.storage_meta.load_id = self.load_id
        return index


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner, reading the entries that are not tensors with weights_only=True
    (DCP's own reads them with weights_only=False). `reader` names the file in a refusal."""

    def __init__(self, reader: SafeReader):
        super().__init__()
        self.reader = reader

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            entry = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL (\S+)", str(exc))  # else damaged bytes: DCP's error
            if found is None:
                raise
            where = self.reader.storage_data[read_item.storage_index].relative_path
            what = f"{found.group(1)} in {read_item.dest_index.fqn}"
            self.reader.refused = CheckpointError(holds_code(Path(self.reader.path) / where, what))
            raise self.reader.refused from None
        # Handed on re-saved: what torch.save writes for tensors and plain values is what
        # weights_only reads, so the planner's own (unrestricted) load builds only those.
        buffer = io.BytesIO()
        torch.save(entry, buffer)
        buffer.seek(0)
        super().load_bytes(read_item, buffer)


def load(state: dict, folder: Path | str) -> None:
    """dcp.load with the reader and planner above: fills `state` in place from `folder`.
    A refusal is raised as it is; DCP's other errors as DCP raises them."""
    reader = SafeReader(folder)
    try:
        dcp.load(state, storage_reader=reader, planner=SafePlanner(reader))
    except BaseException:  # DCP's CheckpointException is no Exception
        if reader.refused is not None:
            raise reader.refused from None
        raise


def check_folder(path: Path, name: str) -> Path:
    """The shard folder `name` that the checkpoint file `path` names, beside it; a
    CorruptCheckpoint if it is missing or incomplete, or a shard file is short (every rank
    checks before the collective read, so train.resume=auto falls back to the previous one)."""
    folder = path.parent / name
    if not (folder / ".metadata").is_file():
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r} names the shard folder {str(folder)!r}, which is "
            "missing or incomplete"
        )
    _check_shards(folder, path)
    return folder


def _check_shards(folder: Path, path: Path) -> None:
    """Raise CorruptCheckpoint unless every shard file that the folder's .metadata points into
    is there and long enough. A truncated or missing shard is found here, by every rank before
    the collective read, so train.resume=auto falls back to the previous checkpoint."""
    try:
        storage = read_index(folder).storage_data or {}
    except CheckpointError:  # it holds code: refused, and not set aside as damaged
        raise
    except OSError as exc:  # the system's fault, not the file's: nothing is set aside
        raise CheckpointError(unreadable(folder / ".metadata", exc)) from None
    except Exception as exc:  # pickled: a damaged index fails in many ways
        raise CorruptCheckpoint(
            f"checkpoint {str(path)!r}: its shard index {str(folder / '.metadata')!r} is "
            f"damaged ({first_line(exc, 160)})"
        ) from None
    ends: dict[str, int] = {}
    for info in storage.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        shard = folder / name
        size = shard.stat().st_size if shard.is_file() else -1
        if size < end:
            what = "missing" if size < 0 else f"truncated ({size} of {end} bytes)"
            raise CorruptCheckpoint(
                f"checkpoint {str(path)!r}: its shard file {str(shard)!r} is {what}"
            )
