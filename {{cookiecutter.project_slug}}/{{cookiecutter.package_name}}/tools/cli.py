"""What every entry point shares: its parser, and the one place that turns an exception into
an exit code and one line.

Exit codes: 0 success, 1 smoke test or export parity check failed, 2 bad input (config, path,
checkpoint, data, a full disk or an unwritable folder), 75 stopped by SIGTERM/SIGUSR1 or a
first Ctrl-C after saving a checkpoint (run again to resume), 130 a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys
from pathlib import Path

from ..errors import UserError, first_line, is_out_of_memory, user_message


def make_parser(description: str, example: str) -> argparse.ArgumentParser:
    """A script's parser; `example` shows overrides that mean something to that script."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return parser


def guard(run, debug: bool, where: dict | None = None) -> int:
    """Bad input is the user's to fix: one line naming it, exit 2, no traceback.

    Besides UserError, that covers what the file system refuses (a full disk, a file-size
    limit, a read-only or unwritable folder, a file where a folder should be, a name too long)
    and allocations too large for the machine. Other errors keep their traceback."""
    _ignore_sigxfsz()
    debug = debug or bool(os.environ.get("DEBUG"))
    try:
        return run()
    except UserError as exc:
        if debug:
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank has the error
            print(f"error: {user_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, MemoryError) as exc:
        message = _os_error_line(exc, (where or {}).get("path")) or _memory_error_line(exc)
        if debug or message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


# errno -> the fix. An OSError naming a file is the user's to fix; without a file name, only
# these write failures are (torch.save's failed writes name no file).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}

_FS_FIXES = {
    errno.ENOSPC: "free space on that disk or choose another run.output_dir, then rerun "
    "with train.resume=auto",
    errno.EDQUOT: "free space within your quota or choose another run.output_dir, then rerun "
    "with train.resume=auto",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or choose another run.output_dir, then "
    "rerun with train.resume=auto",
    errno.EROFS: "choose a writable run.output_dir",
    errno.EACCES: "choose a run.output_dir you may write to, or fix the permissions",
    errno.EPERM: "choose a run.output_dir you may write to, or fix the permissions",
    errno.EEXIST: "remove or rename that file, or choose another run.name",
    errno.ENOTDIR: "a part of that path is a file, not a folder: remove or rename it, or "
    "choose another run.output_dir",
    errno.EISDIR: "a folder is where a file should be: remove or rename it",
    errno.ENAMETOOLONG: "choose a shorter run.name or run.output_dir",
}


def _os_error_line(exc: BaseException, run_dir: Path | None) -> str | None:
    """One line for a file-system refusal, or None for anything else.

    torch.save reports a failed write as a RuntimeError whose context is the OSError."""
    if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError):
        exc = exc.__context__
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    if exc.filename is None and exc.errno not in _WRITE_ERRNOS:
        return None  # e.g. a socket error: not a path the user can fix
    reason = exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))
    fix = _FS_FIXES.get(exc.errno, "check the path")
    if exc.filename is None:
        place = f" under {str(run_dir)!r}" if run_dir else ""
        return f"cannot write{place}: {reason}; {fix}"
    # A temporary file (.name.tmpPID) stands for the file it was about to replace.
    path = re.sub(r"/\.([^/]+)\.tmp\d+$", r"/\1", os.fsdecode(exc.filename))
    if len(path) > 120:  # a name too long for the file system is too long for one line
        path = f"{path[:60]}...{path[-50:]}"
    return f"cannot use {path!r}: {reason}; {fix}"


def _memory_error_line(exc: BaseException) -> str | None:
    if not is_out_of_memory(exc):
        return None
    return (
        f"out of memory ({first_line(exc)}); lower train.batch_size, model.width or "
        "model.depth, or the data.* sizes"
    )


def _ignore_sigxfsz() -> None:
    # Past a file-size limit (ulimit -f) the kernel kills the process with SIGXFSZ by default;
    # ignored, the write fails with EFBIG instead, which guard reports on one line.
    if hasattr(signal, "SIGXFSZ"):
        with contextlib.suppress(ValueError):  # not the main thread: leave the default
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
