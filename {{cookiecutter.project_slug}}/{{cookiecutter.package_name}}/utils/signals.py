"""Stop signals: SIGTERM / SIGUSR1 (what SLURM and cloud schedulers send before they stop a
job) and a first Ctrl-C (SIGINT) set a flag instead of killing the process, so the loop can
save first. A second Ctrl-C quits at once (KeyboardInterrupt, exit 130) without that save;
checkpoints are written atomically, so the last one saved stays whole."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal


def _named(*names: str) -> tuple:
    return tuple(getattr(signal, name) for name in names if hasattr(signal, name))


SIGNALS = _named("SIGTERM", "SIGUSR1", "SIGINT")
# A closed terminal: a tool that runs others in their own sessions stops on it too (they
# would not hear it).
HANGUP = _named("SIGHUP")
# Ignored by the shell that started us (a background job `cmd &`, nohup): they stay ignored.
KEEP_IGNORED = _named("SIGINT", "SIGHUP")


# SIGTERM / SIGUSR1 noted by hold_for_process() while no run was listening (start-up).
_noted: list[str] = []


def hold_for_process() -> None:
    """For an entry point, before anything slow (importing torch): from then until the
    process ends, SIGTERM and SIGUSR1 are noted, never fatal. One during start-up stops the
    run that StopSignal.install() then starts (after its first step, saved: exit 75); one
    after the run's own handlers are gone (a second SIGTERM while the process exits after
    its save) leaves the exit status as it was, not -15."""
    held = _named("SIGTERM", "SIGUSR1")
    catch(held, _note)
    # Python's own shutdown sets its handlers back to the default (die) and then still frees
    # torch for a while; an ignored signal stays ignored through it.
    atexit.register(catch, held, signal.SIG_IGN)


def _note(signum, frame) -> None:
    _noted.append(signal.Signals(signum).name)


def catch(signals, handler) -> dict:
    """Install `handler` for `signals` (but keep KEEP_IGNORED ones that are ignored); returns
    the previous handlers, for restore()."""
    previous = {}
    for sig in signals:
        if sig in KEEP_IGNORED and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, handler)
    return previous


def restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    previous.clear()


class StopSignal:
    def __init__(self):
        self.reason: str | None = None  # the name of the signal received, if any
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def install(self) -> None:
        self._previous = catch(SIGNALS, self._handle)
        if _noted and not self.requested:  # a stop that came during start-up
            self.reason = _noted[0]
        _noted.clear()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # Ctrl-C again: the user would rather not wait for the save
        self.reason = signal.Signals(signum).name
        if signum == signal.SIGINT and os.environ.get("RANK", "0") == "0":
            # os.write, not print: a handler can run in the middle of another print.
            os.write(2, b"\nstopping after this step to save (Ctrl-C again: quit unsaved)\n")

    def restore(self) -> None:
        restore(self._previous)


def stop_with_parent():
    """A Popen preexec_fn (Linux; None elsewhere) for a child in its own session, which its
    parent's signals do not reach: if the parent dies without passing a stop on (kill -9),
    the child gets SIGTERM, so it saves and stops rather than run on unattended."""
    import ctypes  # here: the scripts import this module before anything slow

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):  # not Linux
        return None

    def stop_with_parent() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that
            os.kill(os.getpid(), signal.SIGTERM)

    return stop_with_parent


@contextlib.contextmanager
def deferred_in_children():
    """Block the stop signals while processes are forked (DataLoader workers): a child starts
    with them blocked, so one sent to the whole job (torchrun, scancel) in the moment between
    the fork and ignore_stop_signals() stays pending instead of killing it (torch's worker
    handler dies of SIGTERM, and the training process then raises mid-step). The parent gets
    a signal sent meanwhile once the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals() -> None:
    """For DataLoader workers. torchrun (os.killpg), SLURM (scancel) and a terminal's Ctrl-C
    signal every process of a job, workers included; a worker that dies of SIGTERM (or leaves
    on SIGINT) makes the training process raise mid-step, before it can save. Ignoring the
    signals lets the training process stop at its own pace; the workers still end through
    the loader's shutdown."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked since the fork (deferred_in_children)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
