"""What every entry point shares: its parser (an argument error is one bounded line), the one
place that turns an exception into an exit code and one line, and the tools' stop signals.

Exit codes: 0 success, 1 smoke test or export parity check failed, 2 bad input (config, path,  # feature: export
Exit codes: 0 success, 1 smoke test failed, 2 bad input (config, path,  # feature: !export
checkpoint, data, a full disk or an unwritable folder, a bad argument), 75 stopped by
SIGTERM/SIGUSR1 (training: after saving a checkpoint, or a first Ctrl-C; run again to resume.
A tool: before its output was put in place, nothing written), 130 a second Ctrl-C (a tool:
the first).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import os
import re
import shlex
import signal
import sys

from ..errors import EXIT_STOPPED, UserError, bounded, first_line, is_out_of_memory, user_message
from ..utils import signals


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line, bounded like every other (a megabyte
    value is cut), without the usage block: --help shows that."""

    def error(self, message: str):
        self.exit(2, f"error: {bounded(f'{message}; see {self.prog} --help')}\n")


def make_parser(description: str, example: str) -> Parser:
    """A script's parser; `example` shows overrides that mean something to that script."""
    parser = Parser(description=description)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return parser


# docs/testing.md: key=value overrides every training run (scripts/train.py, and so every rank
# of a torchrun and every tool that starts it) applies after its command line's, e.g.
# train.max_steps=2: the documented commands, run as written, at smoke sizes.
SMOKE_VARIABLE = "SMOKE_OVERRIDES"


def smoke_overrides() -> list[str]:
    """$SMOKE_OVERRIDES, split as a shell splits it; one line (rank 0) says it is in force."""
    try:
        items = shlex.split(os.environ.get(SMOKE_VARIABLE, ""))
    except ValueError as exc:  # an unclosed quote
        raise UserError(f"{SMOKE_VARIABLE}: {exc}; quote its values as a shell would") from None
    if items and os.environ.get("RANK", "0") == "0":
        print(f"{SMOKE_VARIABLE}: {' '.join(items)} (after the command line's)", file=sys.stderr)
    return items


def force_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--force, with the rule every tool's output follows (tools/outputs.py)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"replace an existing --out that is not {what}; a run's checkpoints and records "
        "and the command's own inputs are never replaced",
    )


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGUSR1) that reached a tool before it put its output in place.
    A BaseException, as KeyboardInterrupt: no `except Exception` of the work swallows it."""


_held: list[int] = []  # stop signals noted while a tool cannot act on them
_placing = [False]  # the tool is putting its output in place: a stop waits for that


def hold_signals(hangup: bool = False) -> None:
    """For a tool's script, before its imports (torch takes seconds): a stop signal (SIGTERM,
    SIGUSR1, Ctrl-C; with `hangup`, SIGHUP too: for a tool that runs others) is noted until
    the tool acts on it: guard(stoppable=True) ends the tool (exit 75, or 130 for Ctrl-C;
    nothing written), or a tool that runs others takes the notes over (take_held). Once the
    tool has returned, only noted."""
    held = (*signals.SIGNALS, *signals.HANGUP) if hangup else signals.SIGNALS
    signals.catch(held, _hold)
    # Python's shutdown sets the handlers back to the default (die): ignored, a late signal
    # leaves the exit status as it was.
    atexit.register(signals.catch, held, signal.SIG_IGN)


def take_held() -> list[int]:
    """The stop signals noted since hold_signals(), in order; from here on, the caller's."""
    taken = list(_held)
    _held.clear()
    return taken


def _hold(signum, frame) -> None:
    _held.append(signum)


def _stop(signum, frame) -> None:
    if _placing[0]:
        _held.append(signum)  # the output is being put in place: let it finish, whole
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise Stopped(signal.Signals(signum).name)


def placing_output() -> None:
    """A tool calls this right before it puts its output in place (the renames): from here
    to its end a stop signal is only noted, so the output is whole and the exit code says so."""
    _placing[0] = True


def _act_on_held() -> None:
    if _held:
        _stop(_held.pop(0), None)


def guard(run, debug: bool, where: dict | None = None, stoppable: bool = False) -> int:
    """Bad input is the user's to fix: one line naming it, exit 2, no traceback.

    Besides UserError, that covers what the file system refuses (a full disk, a file-size
    limit, a read-only or unwritable folder, a file where a folder should be, a name too long)
    and allocations too large for the machine. Other errors keep their traceback.
    `stoppable` (the tools; training has its own StopSignal): a stop signal ends the tool at
    once, with one line, until placing_output(): exit 75 (SIGTERM, SIGUSR1), 130 (Ctrl-C)."""
    _ignore_sigxfsz()
    debug = debug or bool(os.environ.get("DEBUG"))
    previous = signals.catch(signals.SIGNALS, _stop) if stoppable else {}
    _placing[0] = False
    try:
        if stoppable:
            _act_on_held()  # one that came during start-up
        return run()
    except Stopped as exc:
        if os.environ.get("RANK", "0") == "0":
            print(f"stopped by {exc}; nothing was written: run the command again", file=sys.stderr)
        return EXIT_STOPPED
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
    finally:
        if stoppable:
            signals.restore(previous)
            _held.clear()


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


def _os_error_line(exc: BaseException, run_dir: os.PathLike | None) -> str | None:
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
