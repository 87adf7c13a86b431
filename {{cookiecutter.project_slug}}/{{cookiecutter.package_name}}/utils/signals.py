"""Preemption signals: SIGTERM / SIGUSR1 (what SLURM and cloud schedulers send before they
stop a job) set a flag instead of killing the process, so the loop can save first."""

from __future__ import annotations

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


def ignore_stop_signals() -> None:
    """For DataLoader workers. torchrun (os.killpg) and SLURM (scancel) signal every process of
    a job, workers included; a worker that dies of SIGTERM makes the training process raise
    mid-step, before it can save. Ignoring the signals lets the training process stop at its
    own pace; the workers still end through the loader's shutdown."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
