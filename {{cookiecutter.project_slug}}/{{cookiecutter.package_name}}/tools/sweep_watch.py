"""How a sweep makes sure no trial outlives it.

A trial that cannot reach a step boundary (a deadlocked loader, a stuck collective or
filesystem) cannot act on a stop. The sweep gives it a grace period after asking (a stop, a
--trial-timeout, pruning), then SIGKILLs its process group (sweep.py). If the sweep itself
dies (`kill -9`), each trial gets SIGTERM from its parent-death signal (it saves and stops),
and `Watchdog`, a small process of its own session that the sweep started, SIGKILLs the
process group of any trial still running a grace period later: no trial outlives its sweep
for longer than that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# How long a trial asked to stop (a stop signal, --trial-timeout, pruning, the sweep's death)
# may take to reach a step boundary and save before its process group gets SIGKILL
# (--stop-grace).
STOP_GRACE_S = 120.0


def kill_group(pid: int) -> None:
    """SIGKILL to a trial's process group (itself and its loader workers): it runs in a
    session of its own, whose id is its pid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# The watchdog's own code: a Python without the site or the package, in a session of its own
# (a signal to the sweep's process group does not reach it). It reads "start PGID LOG" and
# "end PGID" lines from the sweep; at their end (the sweep finished, or died) it waits up to
# GRACE seconds for the trials still running, then SIGKILLs their process groups with a line
# in their logs. A process group id is a trial's pid: the sweep says "end" once it has seen
# the trial end, so only a pid reused within the grace period could be mistaken.
WATCHDOG = r"""
import os, signal, sys, time
grace, groups = float(sys.argv[1]), {}
for line in iter(sys.stdin.readline, ""):
    verb, _, rest = line.strip().partition(" ")
    pgid, _, log = rest.partition(" ")
    if verb == "start":
        groups[int(pgid)] = log
    elif verb == "end":
        groups.pop(int(pgid), None)

def alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True

deadline = time.monotonic() + grace
while time.monotonic() < deadline:
    groups = {pgid: log for pgid, log in groups.items() if alive(pgid)}
    if not groups:
        break
    time.sleep(0.1)
for pgid, log in groups.items():
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        continue
    try:
        with open(log, "a") as f:
            f.write(
                "killed (SIGKILL to its process group): its sweep died and it did not stop "
                f"within {grace:g}s; the same sweep command resumes it from its last "
                "checkpoint\n"
            )
    except OSError:
        pass
"""


class Watchdog:
    """The process that ends the sweep's trials a grace period after the sweep, however the
    sweep ends (WATCHDOG); opened before the first trial starts, closed by close()."""

    def __init__(self, grace: float):
        self.grace, self._proc = grace, None

    def started(self, pid: int, log: Path) -> None:
        self.open()
        self._say(f"start {pid} {log}")

    def open(self) -> None:
        """Start the watchdog's process, if not yet (or tried)."""
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", WATCHDOG, f"{self.grace:g}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                    text=True,
                )
            except OSError as exc:  # no process to spare: the sweep runs without
                print(f"no watchdog ({exc}): a trial stuck when the sweep dies stays behind")
                self._proc = False

    def ended(self, pid: int) -> None:
        self._say(f"end {pid}")

    def _say(self, line: str) -> None:
        if not self._proc:
            return
        with contextlib.suppress(OSError, ValueError):  # gone (killed): the trials run on
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()

    def close(self) -> None:
        """The sweep is done with its trials: the watchdog ends (at once, if none runs)."""
        if not self._proc:
            self._proc = None
            return
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1)  # it has nothing to wait for: no zombie left
        self._proc = None


def wait_for(proc, seconds: float) -> int | None:
    """The trial's exit code once it ends, None if it runs `seconds` more (polling)."""
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll()
