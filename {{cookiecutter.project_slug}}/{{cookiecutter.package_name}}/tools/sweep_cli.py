"""scripts/sweep.py: the arguments, and which sweep they ask for: a grid or random search
(sweep.py), an Optuna study (sweep_optuna.py), a SLURM array, or the report of a sweep's
folder alone. Stop signals are noted from the start to the end (the script holds them from
before its imports, as the tools do: cli.hold_signals): one during start-up stops the sweep
before its first trial (exit 75), one during the report lets the report finish."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from ..errors import EXIT_STOPPED, ConfigError
from ..utils import run_files, signals
from . import cli, sweep_launch
from .cli import guard
from .sweep_watch import STOP_GRACE_S

# SIGHUP too: a closed terminal stops the trials (in their own sessions, they would not hear it).
STOP_SIGNALS = (*signals.SIGNALS, *signals.HANGUP)


def main(root: Path, argv: list[str] | None = None) -> int:
    """The sweep's exit code. The signals' handlers are this call's: restored on return (only
    the main thread has them: called from another, it runs without)."""
    # The stop signals received, in order (those the script's hold_signals() noted first):
    # the sweep's to act on.
    stops: list[int] = cli.take_held()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = signals.catch(STOP_SIGNALS, lambda signum, frame: stops.append(signum))
    try:
        args = _parser().parse_args(argv)
        return guard(lambda: _run(root, args, stops), args.debug)
    finally:
        signals.restore(previous)


def _run(root: Path, args, stops: list[int]) -> int:
    # Imported here, with the signals held: a stop while they load is noted, not fatal.
    from .sweep import Sweep

    if not (args.report or args.dry_run or args.slurm) and Sweep.forks(root):
        sweep_launch.prestart()  # the trials' server imports beside the sweep's checks
    try:
        return _sweep(root, args, stops)
    finally:
        sweep_launch.unused()


def _sweep(root: Path, args, stops: list[int]) -> int:
    from . import sweep_report
    from .sweep import Sweep, sweep_folder
    from .sweep_plan import submit_array

    if args.optuna and not args.report:
        from .sweep_optuna import run_study  # optuna: an optional extra

        return run_study(root, args, stops)
    if args.report:  # what the sweep's folder records, however it was started
        folder = sweep_folder(args, [o for o in args.overrides if _is_output_dir(o)])
        return sweep_report.report(folder, _recorded_trials(folder, args.name))
    sweep = Sweep.create(root, args, stops)
    if args.dry_run:
        print(json.dumps(sweep.trials, indent=1))
        return 0
    if args.slurm and stops:  # stopped while it started: nothing submitted
        print(f"sweep stopped{sweep.stop_cause()} before submitting; run the same command again")
        return EXIT_STOPPED
    if args.slurm:
        return submit_array(sweep, args)
    try:
        return sweep.run(args)
    finally:
        sweep.release()


def _is_output_dir(override: str) -> bool:
    return override.partition("=")[0].strip() == "run.output_dir"


def _recorded_trials(folder: Path, name: str) -> list[dict]:
    from . import sweep_manifest

    manifest = sweep_manifest.read(folder / run_files.SWEEP)
    if manifest is None:
        raise ConfigError(
            f"no sweep {name!r} in {folder.parent} (no sweep.json); check --name, and give "
            "the sweep's run.output_dir=... or --config"
        )
    return manifest["trials"]


def _limits(p: cli.Parser) -> None:
    """The options that bound a trial's time: --trial-timeout and --stop-grace."""
    p.add_argument(
        "--trial-timeout",
        type=float,
        metavar="SECONDS",
        help="a trial running longer is asked to save and stop (SIGKILL after --stop-grace) "
        "and recorded failed; the rerun resumes it from its last checkpoint (default: none)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        metavar="SECONDS",
        help="how long a trial asked to stop (Ctrl-C, SIGTERM, --trial-timeout, pruning, the "
        "sweep's death) may take to save before its process group gets SIGKILL; it resumes "
        f"from its last checkpoint (default: {STOP_GRACE_S:g})",
    )


def _parser() -> cli.Parser:
    p = cli.Parser(description="Run a hyperparameter sweep of scripts/train.py.")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help=(
            "fixed: train.epochs=3; grid axis: train.lr=1e-3,3e-3; with --trials: "
            "log:1e-4:1e-2, uniform:0:0.5, int:1:4, choice:16,32"
        ),
    )
    p.add_argument("--name", required=True, help="sweep folder <run.output_dir>/<name>/")
    p.add_argument("--config", help="YAML config file given to every trial")
    p.add_argument("--trials", type=int, default=0, help="random search: this many configs")
    p.add_argument("--seed", type=int, default=0, help="seed of the random search / --optuna")
    p.add_argument(
        "--optuna",
        type=int,
        default=0,
        metavar="N",
        help="Optuna search (TPE, median pruning) to N trials in all; a rerun retries the "
        "failed trials with their own settings, as a grid's rerun does (pip install -e "
        "'.[sweep]')",
    )
    p.add_argument(
        "--prune-after",
        type=int,
        default=3,
        metavar="K",
        help="with --optuna: prune once K trials finished (below their median at an epoch)",
    )
    p.add_argument(
        "--prune-warmup",
        type=float,
        metavar="EPOCHS",
        help="with --optuna: prune no trial at or before this epoch (default: a quarter of "
        "train.epochs, at least 1: the first epochs' validation is mostly noise)",
    )
    _limits(p)
    p.add_argument("--seeds", type=int, default=1, help="run each config with N seeds")
    p.add_argument("--kfold", type=int, default=0, help="run each config on K folds")
    p.add_argument("--parallel", type=int, default=1, help="trials at a time (subprocesses)")
    p.add_argument("--gpus", help="GPU ids for --parallel, e.g. 0,1 (default: all)")
    p.add_argument("--slurm", action="store_true", help="write and sbatch an array job")
    p.add_argument("--no-submit", action="store_true", help="with --slurm: write only")
    p.add_argument("--sbatch-arg", action="append", default=[], help="passed on to sbatch")
    p.add_argument("--run-index", type=int, help="run only this trial (SLURM array task)")
    p.add_argument("--report", action="store_true", help="only print the results table")
    p.add_argument("--dry-run", action="store_true", help="print the trials as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return p
