"""What a sweep does with its running trials and what it records of each: a stop passed on,
--trial-timeout, the grace period before a stuck trial is SIGKILLed (sweep_watch.py), and a
trial's outcome: "done" only when its run folder says it finished (last.pt and its runs.csv
row, written after the run's last save), a trial that exits 0 without them failed; a trial
stopped or killed is "pending" and resumes on the rerun, except one killed by a signal nobody
sent (the kernel's out-of-memory killer: SIGKILL) twice in a row: it failed. Sweep (sweep.py)
holds these methods."""

from __future__ import annotations

import contextlib
import signal
import time

from ..errors import EXIT_STOPPED
from ..utils import run_files
from . import sweep_manifest, sweep_watch
from .runs_table import runs_table

# A record "running" that no process runs was left by a sweep that was killed: resumed too.
UNFINISHED = ("pending", "running")
# Deaths by a signal that the sweep did not send, in a row, after which a trial has failed
# (the kernel's out-of-memory killer sends SIGKILL at every try).
KILLS_TO_FAIL = 2


class TrialWatch:
    """Sweep's handling of its running trials and of how each ended."""

    def watch(self, running: dict) -> None:
        """Pass a stop on, ask a trial over --trial-timeout to stop, and SIGKILL the process
        group of one that was asked and did not end within the grace period (it resumes from
        its last checkpoint)."""
        self._pass_on(running)
        now = time.monotonic()
        for trial, proc, _, began in running.values():
            if proc.poll() is not None:
                continue
            watched = self._watched.setdefault(trial["id"], {})
            if self.trial_timeout and "asked" not in watched and now - began > self.trial_timeout:
                watched["timed_out"] = True
                self.ask_to_stop(trial, proc, f"ran for --trial-timeout {self.trial_timeout:g}s")
            asked = watched.get("asked")
            if asked is not None and "killed" not in watched and now - asked > self.grace:
                watched["killed"] = True
                sweep_watch.kill_group(proc.pid)
                print(
                    f"{trial['id']}: did not stop within {self.grace:g}s of being asked: "
                    "killed (SIGKILL to its process group); it resumes from its last "
                    "checkpoint when the sweep reruns"
                )

    def ask_to_stop(self, trial: dict, proc, why: str) -> None:
        """SIGTERM (the trial saves at its next step and exits 75); the grace period starts."""
        self._watched.setdefault(trial["id"], {}).setdefault("asked", time.monotonic())
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        print(f"{trial['id']}: {why}: asked to save and stop")

    def ended(self, proc) -> None:
        """A trial of this process ended (its exit code read)."""
        self._running.pop(proc.pid, None)
        if self._watchdog is not None:
            self._watchdog.ended(proc.pid)

    def _pass_on(self, running: dict) -> None:
        """Trials run in their own sessions (a terminal's Ctrl-C reaches only the sweep): once
        asked to stop, each running trial gets SIGTERM (it saves and exits 75) and no new one
        starts; a later Ctrl-C gets them SIGINT (they quit without saving)."""
        if not self.signals:
            return
        wanted = [signal.SIGTERM] + [signal.SIGINT] * (signal.SIGINT in self.signals[1:])
        if not self._sent:  # said once, before the first trial is signalled
            name = signal.Signals(self.signals[0]).name
            print(f"stopping ({name}): running trials save and stop (Ctrl-C again: unsaved)")
        for trial, proc, _, _ in running.values():
            for sig in wanted:
                if sig not in self._sent.setdefault(proc.pid, set()):
                    self._sent[proc.pid].add(sig)
                    self._watched.setdefault(trial["id"], {}).setdefault("asked", time.monotonic())
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                    verb = "save and stop" if sig == signal.SIGTERM else "quit without saving"
                    print(f"{trial['id']}: asked to {verb}")

    def _trial(self, trial_id: str) -> dict:
        return next(t for t in self.trials if t["id"] == trial_id)

    def stop_cause(self) -> str:
        if self.halt:
            return self.halt[0]
        return f" ({signal.Signals(self.signals[0]).name})" if self.signals else ""

    def _say_stopped(self, todo: list[dict]) -> None:
        cause = self.stop_cause()
        ended = [self._trial(i) for i in self._started]
        saved = [t["id"] for t in ended if t["exit_code"] == EXIT_STOPPED]
        # Killed (by a signal, or by the sweep after the grace period) or quit unsaved: each
        # resumes from its last checkpoint.
        cut = [t["id"] for t in ended if t["state"] in UNFINISHED and _interrupted(t)]
        waiting = [t["id"] for t in todo if t["id"] not in self._started]
        print(
            f"sweep stopped{cause}: {len(saved)} trial(s) saved and stopped"
            + (f" ({', '.join(saved)})" if saved else "")
            + (f", {len(cut)} interrupted ({', '.join(cut)})" if cut else "")
            + f", {len(waiting)} not started; run the same command again to continue "
            f"({self.dir})"
        )

    def finished(self, trial: dict, log_at: int = 0) -> bool:
        """Whether the trial's run folder says it finished: its last checkpoint and its row of
        runs.csv, which training writes after the run's last save (a run that stops early
        writes neither row nor summary). A run complete before this try writes no row again:
        its summary in the trial's log since `log_at` says so."""
        run = self.dir / trial["id"]
        if not (run / run_files.LAST).exists():
            return False
        if trial["id"] in runs_table(self.dir):
            return True
        log = self.dir / run_files.SWEEP_LOGS / f"{trial['id']}.out"
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(log_at)
            return f"run {trial['id']} is complete; nothing to do".encode() in f.read()
        return False

    def _finish(self, trial: dict, code: int, seconds: float) -> None:
        watched = self._watched.pop(trial["id"], {})
        # A death by a signal that nobody asked for (the out-of-memory killer, a crash).
        killed = code < 0 and "asked" not in watched
        kills = trial.get("kills", 0) + 1 if killed else 0
        if code == 0 and self.finished(trial, watched.get("log_at", 0)):
            self.update(trial, state="done", exit_code=0, kills=0)
            print(f"{trial['id']}: done in {seconds:.1f}s")
        elif code == 0:
            run = self.dir / trial["id"]
            missing = [f"no {run_files.LAST}"] * (not (run / run_files.LAST).exists())
            missing += [f"no row in {run_files.RUNS}"] * (trial["id"] not in runs_table(self.dir))
            line = f"it exited 0 without finishing its run ({' and '.join(missing)}: {run})"
            self.update(trial, state="failed", exit_code=0, error=line, kills=0)
            print(f"{trial['id']}: failed: {line}")
        elif watched.get("timed_out"):  # saved (or killed): a rerun resumes it
            line = f"stopped after --trial-timeout {self.trial_timeout:g}s (exit {code})"
            self.update(trial, state="failed", exit_code=code, error=line, kills=0)
            print(f"{trial['id']}: failed: {line}; the rerun resumes it from its last checkpoint")
        elif killed and kills >= KILLS_TO_FAIL:
            line = (
                f"killed by {_signal_name(-code)} {kills} times in a row (the kernel's "
                "out-of-memory killer? see dmesg)"
            )
            self.update(trial, state="failed", exit_code=code, error=line, kills=kills)
            print(f"{trial['id']}: failed: {line}; the others go on")
        elif code in (EXIT_STOPPED, 130) or code < 0:  # stopped or killed: resume next time
            self.update(trial, state="pending", exit_code=code, error="interrupted", kills=kills)
            how = "saved and stopped" if code == EXIT_STOPPED else "interrupted"
            again = f" ({_signal_name(-code)}: killed again, it fails)" if killed else ""
            print(f"{trial['id']}: {how} (exit {code}); it resumes when the sweep reruns{again}")
        else:
            log = self.dir / run_files.SWEEP_LOGS / f"{trial['id']}.err"
            line = sweep_manifest.error_line(log)
            failed_write = sweep_manifest.failed_write(line)
            state = "pending" if failed_write else "failed"  # a failed write is tried again
            self.update(trial, state=state, exit_code=code, error=line, kills=0)
            again = "; it is tried again when the sweep reruns" if failed_write else ""
            print(f"{trial['id']}: failed (exit {code}): {line}{again}")
            if failed_write and not self.halt:
                self.halt = (
                    " (a trial could not write)",
                    f"trial {trial['id']}: {failed_write}; the sweep stopped there, as its "
                    "other trials would fail the same way: free space on that disk (or raise "
                    "the limit), then run the same command again to retry it",
                )


def _interrupted(trial: dict) -> bool:
    """Whether a trial's last run ended killed or quit unsaved (not saved, not failed)."""
    code = trial.get("exit_code")
    return code is not None and (code < 0 or code == 130)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
