"""Optuna sweeps (scripts/sweep.py --optuna N): TPE sampling over the ranges --trials takes,
median pruning from each trial's per-epoch validation metric, and the study in
<sweep dir>/study.db (SQLite), so the same command again continues to N trials in all. The
table, results.csv and best.yaml are the other modes' (sweep_report.py).

Trials stay subprocesses of scripts/train.py, as in the other modes: a trial that crashes or
runs out of memory does not take the sweep with it, and Ctrl-C, SIGTERM and resuming work the
same. Between epochs the sweep reads the trial's metrics.csv (whole lines only: training
appends each row in one write) and reports each new validation value to Optuna; a trial the
pruner stops gets SIGTERM, saves and exits, and is recorded as pruned.

sweep.json is the record of what ran: each start makes the study agree with it (a sweep killed
mid-trial leaves its Optuna trial RUNNING); a study.db that cannot be used is one line
(sweep_study.check_study). A rerun retries the trials that failed, with their own settings,
as a grid's rerun does (the study fails their old Optuna trials and asks them again); N
counts the trials recorded, so the retries are not extra trials.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path

from ..config import load_config
from ..errors import EXIT_STOPPED, ConfigError, UserError
from ..utils import run_files
from . import runs_table, sweep_manifest, sweep_report, sweep_study, sweep_watch
from .sweep import UNFINISHED, Sweep, sweep_folder
from .sweep_plan import distributions, param_text, range_spec, split, value_text
from .sweep_study import STEP_UNIT, _report, prune_warmup, step_values

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


def run_study(root: Path, args, stops: list[int] | None = None) -> int:
    """Run (or continue) the study to args.optuna trials; the sweep's exit codes."""
    axes, sweep = _prepare(root, args)
    sweep.signals = stops if stops is not None else sweep.signals
    optuna = import_optuna()
    cfg = load_config(sweep.config, sweep.fixed)
    metric, mode = cfg.best()
    warmup = prune_warmup(args.prune_warmup, cfg.train.epochs)
    path = sweep.dir / run_files.STUDY
    sweep._held = sweep_manifest.hold_sweep(sweep.dir, one_trial=False)
    try:
        sweep_study.check_study(path, args.name)  # before anything is written
        sweep.trials = _merge(sweep, axes)
        sweep.set_limits(args)
        with sweep_study.study_errors(path):
            study = optuna.create_study(
                storage=f"sqlite:///{path}",
                study_name=args.name,
                direction="maximize" if mode == "max" else "minimize",
                # Seeded per start: a continued study does not sample its first trials again.
                sampler=optuna.samplers.TPESampler(seed=args.seed + len(sweep.trials)),
                pruner=optuna.pruners.MedianPruner(
                    n_startup_trials=args.prune_after, n_warmup_steps=warmup
                ),
                load_if_exists=True,
            )
            dists = distributions(axes, optuna)
            _agree(sweep, study, optuna, dists, metric)
            _retry_failed(sweep)
            recorded = f"{len(sweep.trials)} of {args.optuna} trials recorded"
            after = f"pruning after epoch {warmup // STEP_UNIT:g}"
            print(f"sweep {sweep.dir}: optuna, {recorded}, {after}")
            return _run(sweep, study, optuna, dists, args.optuna, metric)
    finally:
        sweep.release()


def _prepare(root: Path, args) -> tuple[dict, Sweep]:
    """The checked axes and a Sweep of no trials yet; refused before anything is written."""
    for flag, default in NOT_WITH.items():
        if getattr(args, flag) != default:
            raise ConfigError(
                f"--{flag.replace('_', '-')} does not go with --optuna (one trial at a time)"
            )
    if args.optuna < 1 or args.prune_after < 0 or (args.prune_warmup or 0) < 0:
        raise ConfigError(
            "--optuna N needs N >= 1, --prune-after K needs K >= 0 and --prune-warmup E >= 0"
        )
    fixed, axes = split(args)
    if not axes:
        raise ConfigError("nothing to tune: give ranges, e.g. train.lr=log:1e-4:1e-2")
    folder = sweep_folder(args, fixed)
    config = str(Path(args.config).resolve()) if args.config else None
    for key, value in axes.items():  # each end of each range must make a valid config
        kind, spec = range_spec(key, value)
        for v in spec if kind == "choice" else [value_text(kind, x) for x in spec]:
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
            sweep._write({**mine, "config_digest": sweep.digest, "trials": []})
            return []
        if any(saved.get(key) != value for key, value in mine.items()):
            raise ConfigError(
                f"sweep {sweep.dir.name!r} exists in {sweep.dir.parent} with other trials or "
                "settings; choose another --name"
            )
        if not sweep_manifest.check_config(sweep.dir, saved, sweep.config, sweep.digest):
            sweep._write({**saved, "config_digest": sweep.digest})  # recorded from now on
        return saved["trials"]


def _agree(sweep: Sweep, study, optuna, dists: dict, metric: str) -> None:
    """Make the study agree with sweep.json after a sweep that died (kill -9, a lost machine):
    a trial it left RUNNING is told how its record ended (an unfinished one FAIL: it is asked
    again with the same settings when it resumes, as Optuna's RetryFailedTrialCallback does),
    and a trial enqueued but never asked is failed. A study.db that does not hold the recorded
    trials is refused; an empty one (removed: a new study) is told the finished trials again."""
    states = optuna.trial.TrialState
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    recorded = [r for r in sweep.trials if r.get("number") is not None]
    if recorded and not trials:
        return _rebuild(sweep, study, optuna, dists, metric)
    for record in recorded:
        trial = trials.get(record["number"])
        if trial is None or trial.params != record["params"]:
            raise ConfigError(sweep_study.not_the_study(sweep.dir / run_files.STUDY, record["id"]))
    by_number = {r["number"]: r for r in recorded}
    for number, trial in trials.items():
        if trial.state == states.RUNNING:
            record = by_number.get(number)
            state, value = _ended(sweep, record, metric) if record else ("FAIL", None)
            study.tell(number, value, state=getattr(states, state))
        elif trial.state == states.WAITING:  # else the next ask would take its settings
            study.tell(study.ask(), state=states.FAIL)
    return None


def _retry_failed(sweep: Sweep) -> None:
    """Failed trials run again with their own settings (resuming from their last checkpoint,
    where they saved one), as a grid's rerun retries them; said in one line."""
    failed = [t for t in sweep.trials if t["state"] == "failed"]
    for trial in failed:
        sweep.update(trial, state="pending")
    if failed:
        ids = ", ".join(t["id"] for t in failed)
        print(f"retrying {len(failed)} failed trial(s) with their own settings: {ids}")


def _ended(sweep: Sweep, record: dict, metric: str) -> tuple[str, float | None]:
    """How a recorded trial ended, as a study's trial state and value."""
    if record["state"] == "done":
        runs = runs_table.runs_table(sweep.dir)
        value = runs_table.best_value(sweep.dir, record["id"], metric, runs)
        return ("COMPLETE", value) if value is not None else ("FAIL", None)
    return ("PRUNED", None) if record["state"] == "pruned" else ("FAIL", None)


def _rebuild(sweep: Sweep, study, optuna, dists: dict, metric: str) -> None:
    """A new study for recorded trials: each finished one is told again, with its validation
    curve, so that sampling and pruning learn from it as before; unfinished ones are asked
    again when they resume."""
    told = 0
    for record in sweep.trials:
        record["number"] = None
        if record["state"] in UNFINISHED:
            continue
        state, value = _ended(sweep, record, metric)
        curve = step_values(sweep.dir / record["id"] / run_files.METRICS, metric)
        study.add_trial(
            optuna.trial.create_trial(
                state=getattr(optuna.trial.TrialState, state), value=value,
                params=record["params"], distributions=dists, intermediate_values=curve,
                user_attrs={"sweep_trial": record["id"]},
            )
        )  # fmt: skip
        record["number"], told = told, told + 1
    with sweep_manifest.locked(sweep.dir) as saved:
        sweep._write({**saved, "trials": sweep.trials})
    print(f"{sweep.dir / 'study.db'}: a new study, told the {told} finished trials of sweep.json")


def _run(sweep: Sweep, study, optuna, dists: dict, n: int, metric: str) -> int:
    while not sweep.stopping():
        trial = next((t for t in sweep.trials if t["state"] in UNFINISHED), None)
        if trial is None and len(sweep.trials) >= n:
            break
        while trial is not None and sweep.busy(trial) and not sweep.stopping():
            time.sleep(0.2)  # a trial left by a killed sweep: it saves and stops first
        if sweep.stopping() or not sweep.same_config():
            break
        asked = _ask(sweep, study, dists, trial)
        _run_trial(sweep, study, optuna, asked, trial or sweep.trials[-1], metric)
    waiting = [t["id"] for t in sweep.trials if t["state"] in UNFINISHED]
    if sweep.stopping() or waiting:
        print(
            f"sweep stopped{sweep.stop_cause()}: {len(sweep.trials)} of {n} trials recorded"
            + (f", {', '.join(waiting)} to resume" if waiting else "")
            + f"; run the same command again to continue ({sweep.dir})"
        )
        if sweep.halt:
            raise UserError(sweep.halt[1])
        return EXIT_STOPPED
    status = sweep_report.report(sweep.dir, sweep.trials)
    failed = [t["id"] for t in sweep.trials if t["state"] == "failed"]
    if failed:
        print(f"{len(failed)} trial(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else status


def _ask(sweep: Sweep, study, dists: dict, trial: dict | None):
    """A new Optuna trial: the next sample, or the same settings again for a recorded trial
    that was stopped (its run resumes where it saved)."""
    if trial is not None:
        study.enqueue_trial(trial["params"], user_attrs={"sweep_trial": trial["id"]})
        asked = study.ask(dists)
        trial["number"] = asked.number
        return asked
    asked = study.ask(dists)
    settings = {k: param_text(v) for k, v in asked.params.items()}
    width = max(3, len(str(len(sweep.trials))))
    name = f"t{len(sweep.trials):0{width}d}" + "".join(
        f"-{k.rpartition('.')[2]}{v}" for k, v in settings.items()
    )
    asked.set_user_attr("sweep_trial", name[:80])  # the run folder of the study's trial
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


def _run_trial(sweep: Sweep, study, optuna, asked, trial: dict, metric: str) -> None:
    """Run one trial, reporting each validation value; tell Optuna how it ended."""
    running = {0: sweep._start(trial, {})}
    proc, reported, pruned = running[0][1], {}, False
    metrics = sweep.dir / trial["id"] / run_files.METRICS
    try:
        while proc.poll() is None:
            sweep.watch(running)  # a stop passed on; --trial-timeout; SIGKILL after the grace
            if not pruned and not sweep.signals:
                pruned = _report(asked, metrics, metric, reported)
                if pruned:  # it saves and exits 75
                    step, value = max(reported.items())
                    epoch = f"{step / STEP_UNIT:g}"
                    sweep.ask_to_stop(trial, proc, f"pruned at epoch {epoch} (val {metric} "
                                      f"{value:.4f})")  # fmt: skip
            time.sleep(0.2)
    except Exception:  # the study failed meanwhile (study.db locked or damaged, a full disk)
        sweep._watched.setdefault(trial["id"], {})["asked"] = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # the trial saves and stops: it resumes later
        if sweep_watch.wait_for(proc, sweep.grace) is None:
            sweep_watch.kill_group(proc.pid)  # it cannot save: it resumes from its last save
        code = sweep_watch.wait_for(proc, 5)
        sweep.ended(proc)
        sweep._finish(trial, -signal.SIGKILL if code is None else code, 0.0)
        raise
    finally:
        running[0][2].close()
    sweep.ended(proc)
    states = optuna.trial.TrialState
    if pruned:
        sweep._watched.pop(trial["id"], None)
        sweep.update(trial, state="pruned", exit_code=proc.returncode, error=None)
        study.tell(asked, state=states.PRUNED)
        return
    sweep._finish(trial, proc.returncode, time.monotonic() - running[0][3])
    runs = runs_table.runs_table(sweep.dir)
    value = runs_table.best_value(sweep.dir, trial["id"], metric, runs)
    if trial["state"] == "done" and value is not None:
        study.tell(asked, value)
    else:  # failed, or stopped to resume: asked again with the same settings next time
        study.tell(asked, state=states.FAIL)
