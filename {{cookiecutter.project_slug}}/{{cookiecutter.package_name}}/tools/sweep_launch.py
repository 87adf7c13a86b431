"""How a sweep starts a trial, and how it makes sure none outlives it.

A trial is `scripts/train.py` with its settings. A new Python process per trial pays Python's
start, `import torch` and the package, and torch._dynamo (imported by torch's optimizers at
their first step) every time: seconds per trial, more than a small trial trains. So on Linux
each trial is forked from a warm process: the standard library's forkserver, started once
per sweep process with torch, the package's training code, torch._dynamo and matplotlib's
figure imported (`PRELOAD`). That server is a new Python process that only imports: it never
computes and never touches CUDA, whoever calls the sweep (scripts/sweep.py, a notebook or a
test suite that has used torch's OpenMP pool or a GPU: GNU OpenMP is not fork-safe, and a
trial forked from such a caller hung for ever). The trial is a process of its own, in its own
session (`start_trial`), exactly as a subprocess was, so a trial's crash, `kill -9` or
out-of-memory still takes only that trial down, the stop signals reach it as before (SIGTERM
saves and exits 75) and its output goes to the same log files. It holds none of the caller's
descriptors (the sweep's lock), handlers or notes of signals; it runs with the environment of
its slot (CUDA_VISIBLE_DEVICES: read at CUDA's first use). The sweep's own process does not
initialise CUDA either: visible_gpus() counts the GPUs in a child process, and a trial forked
from a process that had (inherited_cuda) stops with one line instead of failing at CUDA's use.

Not forked: on other systems and for any command other than the project's scripts/train.py
(and, with a line, where the forkserver cannot start): those trials start as new processes
(`subprocess.Popen`).
(sweep_watch.py ends a trial that cannot stop.)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import traceback
import types
from pathlib import Path

from ..errors import ConfigError
from ..utils import signals

_PACKAGE = __package__.rpartition(".")[0]
# What the forkserver imports once (a module that does not import is left to each trial):
# torch, the training code, torch._dynamo (torch's optimizers import it at their first step)
# and matplotlib's figure, which draws each trial's curves.png at its end (~1 s to import).
PRELOAD = [
    "torch",
    "torch._dynamo",
    f"{_PACKAGE}.trainer",
    f"{_PACKAGE}.tools.train",
    f"{_PACKAGE}.utils.plots",
    "matplotlib.backends.backend_agg",
    "matplotlib.figure",
]
# The stop signals the forkserver must survive: a SIGTERM or SIGHUP to the sweep's process
# group (a terminal closed, `kill -- -PGID`) would end it with the exit codes of the trials
# it started still unread. It ignores SIGINT (a terminal's Ctrl-C) itself.
SERVER_IGNORES = signals._named("SIGTERM", "SIGUSR1", "SIGHUP")
# How visible_gpus counts, in a child: torch.cuda.device_count() initialises CUDA where NVML
# cannot count (MIG slices, no libnvidia-ml), and a process forked after that fails at CUDA.
COUNT_GPUS = "import torch; print(torch.cuda.device_count())"
_broken = False  # the forkserver could not start here: trials start as new processes
_prestarted = False  # prestart() started the server and no trial has used it yet


def can_fork(command: list[str], train_script: Path) -> bool:
    """Whether the trial `command` (argv) starts from the forkserver (Linux, train.py)."""
    return _usable() and command[1:2] == [str(train_script)]


def _usable() -> bool:
    return (
        not _broken
        and sys.platform == "linux"
        and "forkserver" in multiprocessing.get_all_start_methods()
    )


def visible_gpus() -> list[str]:
    """The GPUs trials can be given, as CUDA_VISIBLE_DEVICES values: the entries of this
    process's CUDA_VISIBLE_DEVICES (as many as CUDA counts there), else 0..N-1. Counted in
    a child process (COUNT_GPUS), so that this one never initialises CUDA."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", COUNT_GPUS], capture_output=True, text=True, timeout=300
        )
        count = int(done.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        raise ConfigError(
            "could not count the GPUs for --parallel (a child process running "
            f"{COUNT_GPUS!r} failed); give them with --gpus, e.g. --gpus 0,1"
        ) from None
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = listed.split(",") if listed is not None else [str(i) for i in range(count)]
    return [i.strip() for i in ids[:count]]


def inherited_cuda() -> str | None:
    """The fork guard, checked in the trial: a line if it was forked from a process that had
    initialised CUDA (every CUDA call would fail in it), else None."""
    bad_fork = getattr(getattr(sys.modules.get("torch"), "cuda", None), "_is_in_bad_fork", None)
    if bad_fork is None or not bad_fork():
        return None
    return (
        "error: this trial was forked from a process that had initialised CUDA, which it "
        "cannot use; run the sweep again from a new process (scripts/sweep.py)"
    )


def prestart() -> None:
    """Start the forkserver now, before the sweep imports torch to check its trials: its
    imports (PRELOAD) then run beside the sweep's instead of after them. unused() ends it
    where no trial came to use it (a refused sweep)."""
    global _prestarted, _broken
    from multiprocessing import forkserver

    if not _usable() or forkserver._forkserver._forkserver_pid is not None:
        return
    try:
        _server()
    except (OSError, ValueError, RuntimeError):
        _broken = True
        return
    _prestarted = True


def unused() -> None:
    """End the forkserver prestart() started if no trial used it: none is left importing
    torch after a sweep that was refused or had nothing to run."""
    global _prestarted
    if not _prestarted:
        return
    _prestarted = False
    from multiprocessing import forkserver

    server = forkserver._forkserver
    with contextlib.suppress(OSError):
        os.kill(server._forkserver_pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        server._stop()  # its descriptors and socket; it has ended


class Forked:
    """A trial started from the forkserver, used as the sweep uses subprocess.Popen: pid,
    poll(), returncode (the exit code, or -N for death by signal N), send_signal()."""

    def __init__(self, process):
        self._process, self.pid, self.returncode = process, process.pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._process.exitcode  # the forkserver reports it when the trial ends
            if code is not None:
                self.returncode = code
                self._process.join()  # multiprocessing's record of it: no join at exit
                self._process.close()  # its descriptors
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def start_trial(command: list[str], out: Path, err: Path, env: dict) -> Forked | None:
    """Start `command` (scripts/train.py and its arguments) from the forkserver, its stdout
    and stderr appended to the files `out` and `err`, its environment `env`; None (after a
    line) where the forkserver cannot start: the caller starts a new process instead."""
    global _broken, _prestarted
    _prestarted = False  # the server is in use: it stays for the caller's next sweeps
    context = multiprocessing.get_context("forkserver")
    try:
        server = _server()
        process = context.Process(
            target=_trial_main,
            args=(command, str(out), str(err), env, server),
            name=f"trial {out.stem}",
        )
        with _without_main():
            process.start()
    except (OSError, EOFError, ValueError, RuntimeError) as exc:  # no server (no /tmp, ...)
        _broken = True
        print(f"trials start as new processes (the forkserver did not start: {exc})")
        return None
    return Forked(process)


def _server() -> int:
    """The forkserver's pid, started (once per process) with PRELOAD imported and the stop
    signals the sweep passes on itself ignored (SERVER_IGNORES)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is None:  # (one the caller started keeps its own preload)
        server.set_forkserver_preload(PRELOAD)
        with _ignored(SERVER_IGNORES):  # inherited across exec: it starts ignoring them
            server.ensure_running()
    else:
        server.ensure_running()  # started again if it died
    return server._forkserver_pid


@contextlib.contextmanager
def _ignored(sigs):
    """`sigs` ignored while the body starts a process (only the main thread may set handlers:
    elsewhere the process starts with them as they are). They are blocked meanwhile, so that
    one sent to the sweep then waits for its own handler instead of being lost."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    previous = {}
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
        yield
    finally:
        signals.restore(previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def _without_main():
    """A trial runs train.py, not the caller's script: multiprocessing would import the
    caller's __main__ in each child (a script's or notebook's own code run again there)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _trial_main(command: list[str], out: str, err: str, env: dict, server: int) -> None:
    """The trial, in the child the forkserver forked: its session, logs, environment and
    signals, then train.py's main; its exit code is the trial's."""
    code = 1
    try:
        os.setsid()  # its own session, as start_new_session: a terminal's Ctrl-C is the sweep's
        _drop_server_fd()
        for fd, path in ((1, out), (2, err)):
            log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(log, fd)
            os.close(log)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (line-buffered:
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115  PYTHONUNBUFFERED)
        os.environ.clear()
        os.environ.update(env)
        for sig in (*signals.SIGNALS, *signals.HANGUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signals._noted.clear()
        # multiprocessing made this child's default start method its own (forkserver): a
        # trial's loader workers start as in a new train.py process (the platform's default).
        multiprocessing.set_start_method(None, force=True)
        sys.argv = list(command[1:])
        signals.hold_for_process()  # as scripts/train.py does, before anything else
        _stop_with_server(server)
        refused = inherited_cuda()
        if refused:
            print(refused, file=sys.stderr)
            return  # exit code 1
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


def _drop_server_fd() -> None:
    """Close the forkserver's "alive" pipe, which multiprocessing hands every child: the
    server ends when the sweep does only once no trial holds it (and then the trials' parent
    death signal tells them)."""
    from multiprocessing import forkserver

    fd = forkserver._forkserver._forkserver_alive_fd
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None


def _stop_with_server(server: int) -> None:
    """SIGTERM when the forkserver, this trial's parent, ends: it ends when the sweep that
    started it dies (the trial then saves and stops; Watchdog ends it if it cannot)."""
    import ctypes

    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != server:  # the server (the sweep) died before that
            os.kill(os.getpid(), signal.SIGTERM)
