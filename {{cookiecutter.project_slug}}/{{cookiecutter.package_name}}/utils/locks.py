"""Advisory file locks (flock) that tell "held by another process" from "this filesystem has
no locks" (NFS mounted with nolock, Lustre without -o flock): the first is the caller's to
report; on the second the work goes on unlocked, after one warning per kind of lock. And
the other half of keeping files whole: replace_text, the one way a text file is rewritten,
fsync_dir, which makes a rename durable, and the one rule for temporaries: each writer
(training, every tool) writes through `.<name>.tmp<pid>` beside its target (temporary()), and
what a killed one left is removed once its process is gone, never while it runs
(remove_stale()). Nothing here imports torch: the tools call it before theirs."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: no locks, nothing to warn about)
    fcntl = None

# What flock raises where the filesystem cannot lock at all (not a lock someone holds): NFS
# without its lock daemon ENOLCK, Lustre without -o flock ENOSYS, FUSE and SMB mounts
# EOPNOTSUPP. (Linux's NFS client makes flock an fcntl lock: an exclusive one needs the file
# open for writing, EBADF otherwise, the caller's mistake and not the filesystem's.)
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", 0)}
_warned: set[str] = set()


def lock(
    fd: int, path: os.PathLike | str, risk: str, wait: bool = True, shared: bool = False
) -> bool:
    """Take an exclusive (or, with shared=True, a shared) lock on the open file `fd` (of
    `path`). True when held; False where locks are unavailable (after a warning naming `risk`,
    what can go wrong unlocked). With wait=False a lock that another process holds raises
    BlockingIOError."""
    if fcntl is None:
        return False
    kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.flock(fd, kind | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            raise
        if risk not in _warned:
            _warned.add(risk)
            print(
                f"warning: the filesystem of {os.fspath(path)} does not support file locks "
                f"({os.strerror(exc.errno)}); going on without the lock, so {risk}. To keep "
                "that safe, put run.output_dir on a local disk or a mount with locks (NFS "
                "without nolock, Lustre with -o flock), or make sure only one process uses it."
            )
        return False
    return True


def fsync_dir(path: os.PathLike | str) -> None:
    # Makes the rename itself durable; not possible (nor needed) on Windows.
    if hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_text(path: Path, text: str, durable: bool = True) -> None:
    """Write `text` to `path` in one step: a temporary file in the same folder, renamed over
    it. A full disk, a failed write or a kill leaves the previous file (or none), never half
    of one. `durable` also fsyncs the file and the folder, so that a power cut keeps it (left
    out for a file rewritten at every step)."""
    tmp = temporary(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError as exc:  # a failed write names no file: name the one it was for
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def temporary(target: Path) -> Path:
    """This process's hidden temporary beside `target` (a file, or a staging folder), named
    so that remove_stale() can tell whose it is."""
    return target.with_name(f".{target.name}.tmp{os.getpid()}")


def remove_stale(folder: Path, name: str | None = None) -> list[Path]:
    """Remove what killed writers left in `folder`: temporaries `.<name>.tmp<pid>` (files and
    folders, and `.tmp<pid>.old`) whose process is gone; every name's when `name` is None.
    Another live process's are kept, and so is every other file. Returns what was removed."""
    stem = re.escape(name) if name is not None else ".+"
    pattern = re.compile(rf"\.{stem}\.tmp(\d+)(\.old)?")
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found and not _alive(int(found[1])):
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    # Looked up on this machine only: on a folder shared by several machines, another
    # machine's live process is not seen (docs/reliability.md states the limit).
    if pid == os.getpid():  # ours from an earlier process of the same id: it is gone
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # no process has such an id
        return False
    return True
