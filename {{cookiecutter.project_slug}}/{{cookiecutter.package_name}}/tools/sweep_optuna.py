"""Optuna sweeps (scripts/sweep.py --optuna N): TPE sampling over the ranges --trials takes,
median pruning from each trial's per-epoch validation metric, and the study in
<sweep dir>/study.db (SQLite), so the same command again continues to N trials in all. The
table, results.csv and best.yaml are the other modes' (sweep_report.py).

Trials stay subprocesses of scripts/train.py, as in the other modes: a trial that crashes or
runs out of memory does not take the sweep with it, and Ctrl-C, SIGTERM and resuming work the
same. Between epochs the sweep reads the trial's metrics.csv (whole lines only: training
appends each row in one write) and reports each new validation value to Optuna; a trial the
pruner stops gets SIGTERM, saves and exits, and is recorded as pruned.
"""

from __future__ import annotations

import csv
import signal
import time
from pathlib import Path

from ..config import load_config
from ..errors import ConfigError, UserError
from ..utils import signals
from . import sweep_manifest, sweep_report
from .sweep import _STOP_SIGNALS, EXIT_PREEMPTED, Sweep, sweep_folder
from .sweep_plan import range_spec, split

INSTALL = "pip install -e '.[sweep]'"
# Options of the other modes that an Optuna sweep does not take, with their defaults.
NOT_WITH = {"trials": 0, "seeds": 1, "kfold": 0, "slurm": False, "run_index": None,
            "dry_run": False, "parallel": 1}  # fmt: skip


def import_optuna():
    """optuna, imported only for --optuna: an optional extra."""
    try:
        import optuna
    except ImportError:
        raise UserError(f"--optuna needs the optuna package: {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def run_study(root: Path, args) -> int:
    """Run (or continue) the study to args.optuna trials; the sweep's exit codes."""
    axes, sweep = _prepare(root, args)
    optuna = import_optuna()
    metric, mode = load_config(sweep.config, sweep.fixed).best()
    sweep._held = sweep_manifest.hold_sweep(sweep.dir, one_trial=False)
    try:
        sweep.trials = _merge(sweep, axes)
        study = optuna.create_study(
            storage=f"sqlite:///{sweep.dir / 'study.db'}",
            study_name=args.name,
            direction="maximize" if mode == "max" else "minimize",
            # Seeded per start: a continued study does not sample its first trials again.
            sampler=optuna.samplers.TPESampler(seed=args.seed + len(sweep.trials)),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=args.prune_after),
            load_if_exists=True,
        )
        _fail_stale(study, optuna)
        print(f"sweep {sweep.dir}: optuna, {len(sweep.trials)} of {args.optuna} trials recorded")
        return _run(sweep, study, optuna, _distributions(axes, optuna), args.optuna, metric)
    finally:
        sweep.release()


def _prepare(root: Path, args) -> tuple[dict, Sweep]:
    """The checked axes and a Sweep of no trials yet; refused before anything is written."""
    for flag, default in NOT_WITH.items():
        if getattr(args, flag) != default:
            raise ConfigError(
                f"--{flag.replace('_', '-')} does not go with --optuna (one trial at a time)"
            )
    if args.optuna < 1 or args.prune_after < 0:
        raise ConfigError("--optuna N needs N >= 1, and --prune-after K needs K >= 0")
    fixed, axes = split(args)
    if not axes:
        raise ConfigError("nothing to tune: give ranges, e.g. train.lr=log:1e-4:1e-2")
    folder = sweep_folder(args, fixed)
    config = str(Path(args.config).resolve()) if args.config else None
    for key, value in axes.items():  # each end of each range must make a valid config
        kind, spec = range_spec(key, value)
        for v in spec if kind == "choice" else [_text(kind, x) for x in spec]:
            try:
                load_config(config, [*fixed, f"{key}={v}"])
            except ConfigError as exc:
                raise ConfigError(f"{key}={v}: {exc}") from None
    return axes, Sweep(root, folder, config, fixed, [])


def _merge(sweep: Sweep, axes: dict) -> list[dict]:
    """The recorded trials of this study; a folder of another sweep is refused."""
    with sweep_manifest.locked(sweep.dir) as saved:
        mine = {"config": sweep.config, "fixed": sweep.fixed, "optuna": axes}
        if saved is None:
            sweep._write({**mine, "trials": []})
            return []
        if any(saved.get(key) != value for key, value in mine.items()):
            raise ConfigError(
                f"sweep {sweep.dir.name!r} exists in {sweep.dir.parent} with other trials or "
                "settings; choose another --name"
            )
        return saved["trials"]


def _distributions(axes: dict, optuna) -> dict:
    dists = optuna.distributions
    out = {}
    for key, value in axes.items():
        kind, spec = range_spec(key, value)
        if kind == "choice":
            out[key] = dists.CategoricalDistribution(spec)
        elif kind == "int":
            out[key] = dists.IntDistribution(int(spec[0]), int(spec[1]))
        else:
            out[key] = dists.FloatDistribution(*spec, log=kind == "log")
    return out


def _text(kind: str, value) -> str:
    return str(int(value)) if kind == "int" else f"{value:.4g}"


def _fail_stale(study, optuna) -> None:
    """Trials left running by a sweep that was killed: failed (theirs resume as new ones)."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def _run(sweep: Sweep, study, optuna, dists: dict, n: int, metric: str) -> int:
    previous = signals.catch(_STOP_SIGNALS, lambda signum, frame: sweep.signals.append(signum))
    try:
        while not sweep.signals:
            trial = next((t for t in sweep.trials if t["state"] == "pending"), None)
            if trial is None and len(sweep.trials) >= n:
                break
            asked = _ask(sweep, study, dists, trial)
            _run_trial(sweep, study, optuna, asked, trial or sweep.trials[-1], metric)
    finally:
        signals.restore(previous)
    waiting = [t["id"] for t in sweep.trials if t["state"] == "pending"]
    if sweep.signals or waiting:
        print(
            f"sweep stopped: {len(sweep.trials)} of {n} trials recorded"
            + (f", {', '.join(waiting)} to resume" if waiting else "")
            + f"; run the same command again to continue ({sweep.dir})"
        )
        return EXIT_PREEMPTED
    status = sweep_report.report(sweep.dir, sweep.trials)
    failed = [t["id"] for t in sweep.trials if t["state"] == "failed"]
    return 1 if failed else status


def _ask(sweep: Sweep, study, dists: dict, trial: dict | None):
    """A new Optuna trial: the next sample, or the same settings again for a recorded trial
    that was stopped (its run resumes where it saved)."""
    if trial is not None:
        study.enqueue_trial(trial["params"])
        asked = study.ask(dists)
        trial["number"] = asked.number
        return asked
    asked = study.ask(dists)
    settings = {k: _param_text(v) for k, v in asked.params.items()}
    width = max(3, len(str(len(sweep.trials))))
    name = f"t{len(sweep.trials):0{width}d}" + "".join(
        f"-{k.rpartition('.')[2]}{v}" for k, v in settings.items()
    )
    record = {
        "id": name[:80], "group": name[:80], "settings": settings,
        "overrides": [f"{k}={v}" for k, v in settings.items()], "params": asked.params,
        "number": asked.number, "state": "pending", "exit_code": None, "error": None,
    }  # fmt: skip
    with sweep_manifest.locked(sweep.dir) as saved:
        saved["trials"].append(record)
        sweep._write(saved)
    sweep.trials.append(record)
    return asked


def _param_text(value) -> str:
    """A sampled value as an override: a choice as given, an int, a float to 4 digits."""
    if isinstance(value, str):
        return value
    return _text("int" if isinstance(value, int) else "float", value)


def _run_trial(sweep: Sweep, study, optuna, asked, trial: dict, metric: str) -> None:
    """Run one trial, reporting each epoch's validation value; tell Optuna how it ended."""
    running = {0: sweep._start(trial, {})}
    proc, reported, pruned = running[0][1], {}, False
    metrics = sweep.dir / trial["id"] / "metrics.csv"
    while proc.poll() is None:
        if sweep.signals:
            sweep._pass_on(running)
        elif not pruned:
            pruned = _report(asked, metrics, metric, reported)
            if pruned:
                proc.send_signal(signal.SIGTERM)  # it saves and exits 75
                epoch, value = max(reported.items())
                print(f"{trial['id']}: pruned at epoch {epoch} (val {metric} {value:.4f})")
        time.sleep(0.2)
    running[0][2].close()
    states = optuna.trial.TrialState
    if pruned:
        sweep.update(trial, state="pruned", exit_code=proc.returncode, error=None)
        study.tell(asked, state=states.PRUNED)
        return
    sweep._finish(trial, proc.returncode, time.monotonic() - running[0][3])
    runs = sweep_report.runs_table(sweep.dir)
    value = sweep_report.best_value(sweep.dir, trial["id"], metric, runs)
    if trial["state"] == "done" and value is not None:
        study.tell(asked, value)
    else:  # failed, or stopped to resume: asked again with the same settings next time
        study.tell(asked, state=states.FAIL)


def _report(asked, path: Path, metric: str, reported: dict) -> bool:
    """Report the new epochs' validation values; True when the pruner says stop."""
    for epoch, value in epoch_values(path, metric).items():
        if epoch not in reported:
            reported[epoch] = value
            asked.report(value, epoch)
    return bool(reported) and asked.should_prune()


def epoch_values(path: Path, metric: str) -> dict[int, float]:
    """{epoch: val/<metric>} from the complete lines of a metrics.csv being written."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
        return {}
    values = {}
    for row in csv.DictReader(line for line in lines if line.endswith("\n")):
        try:
            epoch, value = int(float(row["epoch"])), float(row[f"val/{metric}"])
        except (KeyError, TypeError, ValueError):  # a training row, or no epoch column
            continue
        values.setdefault(epoch, value)
    return values
