"""Preemption signals: SIGTERM / SIGUSR1 (what SLURM and cloud schedulers send before they
stop a job) set a flag instead of killing the process, so the loop can save first."""

from __future__ import annotations

import contextlib
import signal

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


class StopSignal:
    def __init__(self):
        self.reason: str | None = None  # the name of the signal received, if any
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def install(self) -> None:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.reason = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


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
    """For DataLoader workers. torchrun (os.killpg) and SLURM (scancel) signal every process of
    a job, workers included; a worker that dies of SIGTERM makes the training process raise
    mid-step, before it can save. Ignoring the signals lets the training process stop at its
    own pace; the workers still end through the loader's shutdown."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked since the fork (deferred_in_children)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
