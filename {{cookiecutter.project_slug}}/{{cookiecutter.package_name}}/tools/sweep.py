"""Hyperparameter sweeps: plan trials (grid, random search, seeds, folds), run each as a named
run of scripts/train.py, and keep their state in <run.output_dir>/<sweep>/sweep.json.

sweep_cli.py reads the arguments and starts a Sweep here. Each trial is
`train.py ... run.output_dir=<sweep dir> run.name=<trial> train.resume=auto`, so running the
same sweep again skips done trials and resumes the rest.
Results (table, results.csv, best.yaml, plots) are sweep_report.py's; sweep.json, its atomic
writes and the locks are sweep_manifest.py's; --optuna is sweep_optuna.py's; how a trial
starts (forked from a warm server) is sweep_launch.py's, and the watchdog that ends trials a
dead sweep left is sweep_watch.py's.

What a trial's record says is what happened to it, and how running trials are stopped, are
sweep_trials.py's: no stuck trial holds the sweep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..config import load_config
from ..errors import EXIT_STOPPED, ConfigError, UserError
from ..utils import run_files, signals
from . import sweep_launch, sweep_manifest, sweep_report, sweep_watch
from .sweep_plan import SBATCH_MISSING, plan, slots_for
from .sweep_trials import UNFINISHED, TrialWatch
from .sweep_watch import STOP_GRACE_S


def sweep_folder(args, fixed: list[str]) -> Path:
    """<run.output_dir>/<--name>/, after checking that --name is a folder name."""
    if not args.name or not all(c.isalnum() or c in "-_." for c in args.name):
        raise ConfigError(f"--name must be a folder name (letters, digits, - _ .): {args.name!r}")
    return Path(load_config(args.config, fixed).run.output_dir) / args.name


class Sweep(TrialWatch):
    """A sweep folder: its manifest and the trials it runs."""

    def __init__(self, root: Path, folder: Path, config, fixed: list[str], trials: list[dict]):
        self.root, self.dir, self.config, self.fixed = root, folder, config, fixed
        self.trials = trials
        # The stop signals received, in order: sweep_cli.main's list, noted since start-up.
        self.signals: list[int] = []
        # Why no more trials start, and the error line the sweep ends with (exit 2): a trial
        # could not write, or the --config file changed while the sweep ran.
        self.halt: tuple[str, str] | None = None
        self.digest = sweep_manifest.config_digest(config)
        self.slots: list[dict] = [{}]  # where trials run: set from --parallel and --gpus
        self._held: int | None = None  # the sweep lock's descriptor while this process runs it
        self._sent: dict[int, set] = {}  # pid -> the signals passed on to that trial
        self._started: list[str] = []  # the trials this process started
        self._waiting: set[str] = set()  # trials whose run folder another process holds
        self.grace, self.trial_timeout = STOP_GRACE_S, None  # set_limits: --stop-grace ...
        # Per running trial id: when it was asked to stop, whether --trial-timeout asked, and
        # whether the sweep killed it after the grace period.
        self._watched: dict[str, dict] = {}
        self._running: dict[int, object] = {}  # pid -> the trials this process runs
        self._watchdog: sweep_watch.Watchdog | None = None

    def set_limits(self, args) -> None:
        """--stop-grace and --trial-timeout, checked."""
        grace, timeout = getattr(args, "stop_grace", None), getattr(args, "trial_timeout", None)
        if (grace is not None and not grace >= 0) or (timeout is not None and not timeout > 0):
            raise ConfigError("--stop-grace needs SECONDS >= 0 and --trial-timeout SECONDS > 0")
        self.grace = STOP_GRACE_S if grace is None else grace
        self.trial_timeout = timeout

    @classmethod
    def create(cls, root: Path, args, stops: list[int] | None = None) -> Sweep:
        sweep_folder(args, [])  # the name first: nothing else means much with a bad one
        fixed, trials = plan(args)
        if not trials:
            raise ConfigError("nothing to sweep: give a grid (key=a,b) or --trials N with ranges")
        folder = sweep_folder(args, fixed)
        # Absolute: trials, SLURM tasks (which cd to the project) and reruns find the same file.
        config = str(Path(args.config).resolve()) if args.config else None
        sweep = cls(root, folder, config, fixed, trials)
        sweep.signals = stops if stops is not None else sweep.signals
        sweep.set_limits(args)
        for trial in trials:  # bad input stops the sweep before any trial runs
            try:
                load_config(config, sweep.overrides(trial))
            except ConfigError as exc:
                raise ConfigError(f"trial {trial['id']}: {exc}") from None
        sweep.slots = slots_for(args.parallel, args.gpus)
        if args.run_index is not None and not 0 <= args.run_index < len(trials):
            raise ConfigError(f"--run-index {args.run_index} is not in 0..{len(trials) - 1}")
        if args.slurm and not (args.dry_run or args.no_submit) and not shutil.which("sbatch"):
            raise ConfigError(SBATCH_MISSING)  # before sweep.json: a refused sweep writes nothing
        if not args.dry_run:  # a dry run writes nothing
            if not args.slurm:  # held until this process ends: a second sweep is refused
                sweep._held = sweep_manifest.hold_sweep(folder, args.run_index is not None)
            sweep._merge_manifest()
        return sweep

    @classmethod
    def forks(cls, root: Path) -> bool:
        """Whether the trials of a sweep of the project at `root` start from the forkserver
        (sweep_launch.can_fork): known before any config is read."""
        probe = cls(root, root, None, [], [])
        command = probe.command({"id": "t", "overrides": []})
        return sweep_launch.can_fork(command, root / "scripts" / "train.py")

    def command(self, trial: dict) -> list[str]:
        config = ["--config", self.config] if self.config else []
        train = str(self.root / "scripts" / "train.py")
        return [sys.executable, train, *config, *self.overrides(trial)]

    def overrides(self, trial: dict) -> list[str]:
        """The trial's key=value settings, laid over the sweep's --config file."""
        return [
            *self.fixed,
            *trial["overrides"],
            f"run.output_dir={self.dir}",
            f"run.name={trial['id']}",
            "train.resume=auto",
        ]

    def _merge_manifest(self) -> None:
        """Keep the recorded state of an existing sweep of the same trials."""
        with sweep_manifest.locked(self.dir) as saved:
            if saved is None:
                self._write(
                    {"config": self.config, "config_digest": self.digest, "fixed": self.fixed,
                     "trials": self.trials}
                )  # fmt: skip
                return
            same = [(t["id"], t["overrides"]) for t in saved["trials"]]
            if (
                same != [(t["id"], t["overrides"]) for t in self.trials]
                or saved["fixed"] != self.fixed
                or saved.get("config") != self.config
            ):
                raise ConfigError(
                    f"sweep {self.dir.name!r} exists in {self.dir.parent} with other "
                    "trials or settings; choose another --name"
                )
            if not sweep_manifest.check_config(self.dir, saved, self.config, self.digest):
                self._write({**saved, "config_digest": self.digest})  # recorded from now on
            self.trials = saved["trials"]

    def release(self) -> None:
        """The sweep is over in this process: no trial of it runs on (one left by an error
        is asked to stop, then killed after the grace period), and the lock is let go."""
        for pid, proc in list(self._running.items()):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            if sweep_watch.wait_for(proc, self.grace) is None:
                sweep_watch.kill_group(pid)
                sweep_watch.wait_for(proc, 5)
            self._running.pop(pid, None)
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def _write(self, manifest: dict) -> None:
        sweep_manifest.write(self.dir / run_files.SWEEP, manifest)

    def update(self, trial: dict, **fields) -> None:
        trial.update(fields)
        with sweep_manifest.locked(self.dir) as saved:
            for i, old in enumerate(saved["trials"]):
                if old["id"] == trial["id"]:
                    saved["trials"][i] = trial
            self._write(saved)

    def run(self, args) -> int:
        todo = [t for t in self.trials if t["state"] != "done"]
        if args.run_index is not None:
            todo = [t for t in [self.trials[args.run_index]] if t["state"] != "done"]
        slots = self.slots
        print(
            f"sweep {self.dir}: {len(self.trials)} trials, {len(todo)} to run, "
            f"{len(slots)} at a time"
        )
        self._run_all(todo, slots)
        if self.stopping() or any(t["state"] in UNFINISHED for t in todo):
            self._say_stopped(todo)
            if self.halt:
                raise UserError(self.halt[1])
            return EXIT_STOPPED
        if args.run_index is not None:
            failed = bool(todo) and todo[0]["state"] == "failed"
            return (todo[0]["exit_code"] or int(failed)) if todo else 0
        status = sweep_report.report(self.dir, self.trials)
        failed = [t["id"] for t in self.trials if t["state"] == "failed"]
        if failed:
            print(f"{len(failed)} trial(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else status

    def stopping(self) -> bool:
        """No trial starts once a signal asked to stop or the sweep halted."""
        return bool(self.signals or self.halt)

    def same_config(self) -> bool:
        """Whether the --config file (and those it extends) still holds the settings the sweep
        started with: trials started after an edit would train other models, ranked with the
        ones before it. The sweep halts at the first change."""
        if sweep_manifest.config_digest(self.config) == self.digest:
            return True
        self.halt = self.halt or (
            " (its --config file changed)",
            f"the --config file {self.config!r} (or a file it extends) changed while the sweep "
            "ran: the trials not yet started would train other models than the others; put "
            "the file back as it was and run the same command again, or start another sweep "
            "(another --name) with the new file",
        )
        return False

    def _run_all(self, todo: list[dict], slots: list[dict]) -> None:
        """Start trials in free slots until all ran, a signal asks to stop or the sweep halts."""
        running: dict[int, tuple] = {}
        queue = list(todo)
        while (queue and not self.stopping()) or running:
            for slot in range(len(slots)):
                if slot in running or self.stopping():
                    continue
                trial = next((t for t in queue if not self.busy(t)), None)
                if trial is None or not self.same_config():
                    break
                queue.remove(trial)
                running[slot] = self._start(trial, slots[slot])
            self.watch(running)
            for slot, (trial, proc, err, began) in list(running.items()):
                if proc.poll() is not None:
                    del running[slot]
                    err.close()
                    self.ended(proc)
                    self._finish(trial, proc.returncode, time.monotonic() - began)
            time.sleep(0.05)

    def busy(self, trial: dict) -> bool:
        """Whether another process still holds the trial's run folder (said once): a trial that
        a killed sweep left behind saves and stops first; it resumes after."""
        if not sweep_manifest.run_busy(self.dir / trial["id"]):
            return False
        if trial["id"] not in self._waiting:
            self._waiting.add(trial["id"])
            print(f"{trial['id']}: waiting for the process that still holds its run folder")
        return True

    def _start(self, trial: dict, slot: dict) -> tuple:
        logs = self.dir / run_files.SWEEP_LOGS
        logs.mkdir(exist_ok=True)
        out = (logs / f"{trial['id']}.out").open("a")
        log_at = out.tell()  # where this try's output starts
        err = (logs / f"{trial['id']}.err").open("w+")
        extra = [f"run.threads={slot['threads']}"] if slot.get("threads") else []
        env = {**os.environ, **slot.get("env", {}), "PYTHONUNBUFFERED": "1"}
        command = self.command(trial) + extra
        if self._watchdog is None:
            self._watchdog = sweep_watch.Watchdog(self.grace)
        # Its process first: a sweep killed right after a launch leaves no trial unwatched.
        self._watchdog.open()
        proc = None
        if sweep_launch.can_fork(command, self.root / "scripts" / "train.py"):
            paths = logs / f"{trial['id']}.out", logs / f"{trial['id']}.err"
            proc = sweep_launch.start_trial(command, *paths, env)
        if proc is None:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # see _pass_on
                preexec_fn=signals.stop_with_parent(),
            )
        self._watchdog.started(proc.pid, logs / f"{trial['id']}.out")
        self._watched[trial["id"]] = {"log_at": log_at}
        out.close()
        self._running[proc.pid] = proc
        self._started.append(trial["id"])
        self.update(trial, state="running", exit_code=None, error=None)
        gpu = slot.get("env", {}).get("CUDA_VISIBLE_DEVICES")
        print(
            f"{trial['id']}: started ({', '.join(trial['overrides']) or 'fixed settings'})"
            f"{f' on GPU {gpu}' if gpu is not None else ''} log {logs / trial['id']}.out"
        )
        return trial, proc, err, time.monotonic()
