"""How a sweep starts a trial: forked from the sweep's own warm process, or as a new one.

A trial is `scripts/train.py` with its settings. A new Python process per trial pays Python's
start, `import torch` and the package, and torch._dynamo (imported by torch's optimizers at
their first step) every time: seconds per trial, more than a small trial trains. So on Linux
the sweep imports all of it once (`warm`) and forks each trial from itself (`fork_trial`):
the child is a process of its own, in its own session, exactly as the subprocess was, so a
trial's crash, `kill -9` or out-of-memory still takes only that trial down, the stop signals
reach it as before (SIGTERM saves and exits 75; a dead sweep's children get SIGTERM from
their parent-death signal), and its output goes to the same log files. What the fork must
not inherit is reset in the child: the signal handlers and mask, the notes of signals the
sweep heard, the sweep's lock (its descriptor, shared by a fork, would keep a second sweep
out after this one died), the environment of the trial's slot (CUDA_VISIBLE_DEVICES: read at
CUDA's first use, which the sweep never makes).

Never forked: where CUDA is initialised in the sweep (a forked CUDA context is unusable),
where fork is unsafe (macOS) or missing (Windows), and any command other than the project's
scripts/train.py; those trials start as new processes (`subprocess.Popen`), as before.
The sweep process never computes with torch before it forks, so no OpenMP thread team exists
there to be copied half-alive into a child (GNU OpenMP is not fork-safe).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path

from ..utils import signals


def can_fork(command: list[str], train_script: Path) -> bool:
    """Whether the trial `command` (argv) can be forked from this process."""
    if sys.platform != "linux" or command[1:2] != [str(train_script)]:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def warm() -> None:
    """Import, once, what every trial imports: torch, the package's training code,
    torch._dynamo (which torch's optimizers import at their first step) and matplotlib's
    figure, which draws each trial's curves.png at its end (~1 s to import)."""
    import torch._dynamo  # noqa: F401

    from ..utils import plots
    from . import train  # noqa: F401  (trainer, data, models, tasks, checkpoint, ...)

    if plots.available():
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401


class Forked:
    """A forked trial, used as the sweep uses subprocess.Popen: pid, poll(), returncode,
    send_signal(), wait()."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:  # as Popen: the exit code, or -N for death by signal N
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def fork_trial(command: list[str], out, err, env: dict, close: list[int]) -> Forked:
    """Run `command` (scripts/train.py and its arguments) in a child forked from this warm
    process, its stdout and stderr into the files `out` and `err`, its environment `env`;
    `close`: descriptors of this process the child must not hold (the sweep's lock)."""
    warm()  # once per sweep process: later calls find the modules imported
    stop_with_parent = signals.stop_with_parent()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing buffered here may be written twice, by parent and child
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        os.setsid()  # its own session, as start_new_session: a terminal's Ctrl-C is the sweep's
        if stop_with_parent is not None:
            stop_with_parent()
        for fd in close:
            os.close(fd)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (line-buffered:
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115  PYTHONUNBUFFERED)
        os.environ.clear()
        os.environ.update(env)
        for sig in (*signals.SIGNALS, *signals.HANGUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signals._noted.clear()  # what the sweep heard is not this trial's
        sys.argv = list(command[1:])
        signals.hold_for_process()  # as scripts/train.py does, before anything else
        from .train import train_main

        code = train_main(command[2:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:  # a second Ctrl-C: quit without saving, as train.py's 130
        code = 130
    except BaseException:  # noqa: BLE001  (a trial's bug: its traceback, in its own log)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
