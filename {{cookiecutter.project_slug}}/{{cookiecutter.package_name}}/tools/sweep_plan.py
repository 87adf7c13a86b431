"""Planning a sweep: the trials (grid, random search, seeds x folds) with readable ids, the
ranges as Optuna's distributions, the slots trials run in (a GPU or a share of the CPUs each),
and the SLURM array script."""

from __future__ import annotations

import itertools
import math
import os
import random
import re
import shlex
import subprocess

from ..config import load_config
from ..errors import ConfigError
from ..utils import locks, run_files
from .sweep_launch import visible_gpus

# Set per trial by the sweep: a fixed override of one of these would be overwritten.
PER_TRIAL = ("run.name", "train.resume")
RANGES = ("log", "uniform", "int", "choice")


def plan(args) -> tuple[list[str], list[dict]]:
    """The fixed overrides and the trials: one per config x seed x fold."""
    fixed, axes = split(args)
    configs = _random(axes, args.trials, args.seed) if args.trials else _grid(axes)
    return fixed, _trials(args, fixed, axes, configs)


def split(args) -> tuple[list[str], dict[str, str]]:
    """The fixed overrides and the swept axes {key: "a,b" or a range}; a key swept twice, or
    swept and set per trial by the sweep, is refused."""
    fixed, axes = [], {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        kind = value.partition(":")[0]
        if sep and (kind in RANGES or ("," in value and value[:1] not in "[{\"'")):
            _refuse_twice(key.strip(), axes)
            axes[key.strip()] = value
        else:
            fixed.append(item)
    for item in fixed:
        if item.partition("=")[0].strip() in PER_TRIAL:
            raise ConfigError(f"{item!r}: the sweep sets {', '.join(PER_TRIAL)} per trial")
    # Keys the sweep sets per trial besides the axes: --seeds the seed, --kfold the fold.
    for item in fixed:
        _refuse_twice(item.partition("=")[0].strip(), axes)
    for key in ["run.seed"] * (args.seeds > 1):
        _refuse_twice(key, axes, "by --seeds")
    for key in ["data.fold", "data.folds"] * bool(args.kfold):
        _refuse_twice(key, axes, "by --kfold")
    return fixed, axes


def _trials(args, fixed: list[str], axes: dict, configs: list[dict]) -> list[dict]:
    """Each config once per seed x fold, with readable ids."""
    reps = [[]]
    if args.seeds > 1:
        base = load_config(args.config, fixed).run.seed
        reps = [[*r, f"run.seed={base + s}"] for r in reps for s in range(args.seeds)]
    if args.kfold:
        if args.kfold < 2:
            raise ConfigError(f"--kfold must be >= 2, got {args.kfold}")
        folds = [f"data.folds={args.kfold}"]
        reps = [[*r, *folds, f"data.fold={f}"] for r in reps for f in range(args.kfold)]
    trials, width = [], max(2, len(str(len(configs) - 1)))
    short = _short_names(list(axes))
    for i, settings in enumerate(configs):
        group = f"t{i:0{width}d}" + "".join(f"-{short[k]}{v}" for k, v in settings.items())
        group = re.sub(r"[^A-Za-z0-9._-]", "_", group)[:80]
        for rep in reps:
            tail = "".join(
                f"-{o.split('.')[1][0]}{o.split('=')[1]}" for o in rep if "folds" not in o
            )
            trials.append(
                {
                    "id": group + tail,
                    "group": group,
                    "settings": settings,
                    "overrides": [f"{k}={v}" for k, v in settings.items()] + rep,
                    "state": "pending",
                    "exit_code": None,
                    "error": None,
                }
            )
    return trials


def _refuse_twice(key: str, axes: dict[str, str], by: str = "again") -> None:
    """A swept key set again (another axis, a fixed value, --seeds or --kfold) would silently
    replace one of the two: refused. Fixed values may repeat (the last wins, as in train.py)."""
    if key in axes:
        raise ConfigError(
            f"{key} is given twice (swept as {key}={axes[key]} and set {by}); keep one"
        )


def _grid(axes: dict[str, str]) -> list[dict]:
    for key, value in axes.items():
        if value.partition(":")[0] in RANGES:
            raise ConfigError(f"{key}={value} is a range: add --trials N to sample from it")
    lists = {k: [v.strip() for v in value.split(",") if v.strip()] for k, value in axes.items()}
    return [dict(zip(lists, values, strict=True)) for values in itertools.product(*lists.values())]


def _random(axes: dict[str, str], n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    specs = {key: _range(key, value) for key, value in axes.items()}
    return [{key: sample(rng) for key, sample in specs.items()} for _ in range(n)]


def range_spec(key: str, value: str) -> tuple[str, list[str] | tuple[float, float]]:
    """("choice", [values]) or (log | uniform | int, (LOW, HIGH)), checked."""
    kind, _, rest = value.partition(":")
    if kind not in RANGES:  # a comma list: a choice
        kind, rest = "choice", value
    if kind == "choice":
        return kind, [v.strip() for v in rest.split(",") if v.strip()]
    try:
        low, high = (float(x) for x in rest.split(":"))
    except ValueError:
        raise ConfigError(f"{key}={value}: write {kind}:LOW:HIGH, e.g. log:1e-4:1e-2") from None
    if not low < high or (kind == "log" and low <= 0):
        raise ConfigError(f"{key}={value}: needs LOW < HIGH" + (", both > 0" * (kind == "log")))
    return kind, (low, high)


def distributions(axes: dict, optuna) -> dict:
    """The --optuna ranges as Optuna's distributions."""
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


def value_text(kind: str, value) -> str:
    return str(int(value)) if kind == "int" else f"{value:.4g}"


def param_text(value) -> str:
    """A sampled value as an override: a choice as given, an int, a float to 4 digits."""
    if isinstance(value, str):
        return value
    return value_text("int" if isinstance(value, int) else "float", value)


def _range(key: str, value: str):
    kind, spec = range_spec(key, value)
    if kind == "choice":
        return lambda rng: rng.choice(spec)
    low, high = spec
    if kind == "int":
        return lambda rng: str(rng.randint(int(low), int(high)))
    if kind == "log":
        return lambda rng: f"{math.exp(rng.uniform(math.log(low), math.log(high))):.3g}"
    return lambda rng: f"{rng.uniform(low, high):.3g}"


def _short_names(keys: list[str]) -> dict[str, str]:
    """train.lr -> lr; the whole key where two sections share a leaf name."""
    leaves = [k.rpartition(".")[2] for k in keys]
    return {
        k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(keys, leaves, strict=True)
    }


def slots_for(parallel: int, gpus: str | None) -> list[dict]:
    """One entry per concurrent trial: its GPU (CUDA_VISIBLE_DEVICES) or its CPU threads."""
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {parallel}")
    if parallel == 1 and gpus is None:
        return [{}]
    if gpus is None:  # counted in a child process: this one leaves CUDA alone
        gpus = ",".join(visible_gpus())
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if ids:
        return [{"env": {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]}} for i in range(parallel)]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cpus or 1) // parallel)
    return [{"threads": threads, "env": {"OMP_NUM_THREADS": str(threads)}}] * parallel


SBATCH_MISSING = "sbatch not found: run on a SLURM login node, or use --no-submit"


def submit_array(sweep, args) -> int:
    """Write <sweep dir>/sweep_array.sh, one array task per trial, and sbatch it."""
    same = ["--name", args.name, *(["--config", sweep.config] if sweep.config else [])]
    for flag in ("trials", "seed", "seeds", "kfold"):
        same += [f"--{flag}", str(getattr(args, flag))]
    for flag in ("trial_timeout", "stop_grace"):  # each array task's own trial
        if getattr(args, flag, None) is not None:
            same += [f"--{flag.replace('_', '-')}", f"{getattr(args, flag):g}"]
    same += args.overrides
    script = sweep.dir / run_files.ARRAY_SCRIPT
    fields = {
        "@NAME@": args.name,
        "@LAST@": str(len(sweep.trials) - 1),
        "@LOGS@": str(sweep.dir / run_files.SWEEP_LOGS),
        "@ROOT@": shlex.quote(str(sweep.root)),
        "@ARGS@": shlex.join(same),
    }
    text = ARRAY_SCRIPT
    for placeholder, value in fields.items():
        text = text.replace(placeholder, value)
    locks.replace_text(script, text)
    (sweep.dir / run_files.SWEEP_LOGS).mkdir(exist_ok=True)
    print(f"wrote {script} ({len(sweep.trials)} array tasks)")
    if args.no_submit:
        print(f"submit it with: sbatch {script}")
        return 0
    try:
        proc = subprocess.run(
            ["sbatch", *args.sbatch_arg, str(script)],
            capture_output=True,
            text=True,
            cwd=sweep.root,
        )
    except FileNotFoundError:  # gone since Sweep.create looked
        raise ConfigError(SBATCH_MISSING) from None
    if proc.returncode != 0:
        raise ConfigError(f"sbatch failed: {_tail(proc.stderr or proc.stdout)}")
    job = re.search(r"(\d+)", proc.stdout)
    print(f"submitted job {job.group(1) if job else proc.stdout.strip()}")
    return 0


def _tail(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


# The @FIELDS@ are filled in by submit_array. USR1 comes 120 s before the time limit (SIGTERM
# on preemption): the trial saves and exits 75,
# then the task requeues itself and resumes with train.resume=auto.
ARRAY_SCRIPT = """#!/bin/bash
# Sweep @NAME@: one SLURM array task per trial. Written by scripts/sweep.py --slurm.
#SBATCH --job-name=sweep-@NAME@
#SBATCH --array=0-@LAST@
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=@LOGS@/slurm-%A_%a.out
# Resources (add your own, e.g. sbatch --gpus=1 --time=4:00:00, or --sbatch-arg to sweep.py)

set -uo pipefail
cd @ROOT@

requeue=0
# shellcheck disable=SC2317,SC2329  # (reached through the trap)
stop() {
    requeue=1
    kill -TERM "$pid" 2>/dev/null || true
}
trap stop USR1 TERM

"${PYTHON:-python}" scripts/sweep.py --run-index "$SLURM_ARRAY_TASK_ID" @ARGS@ &
pid=$!
status=0
wait "$pid" || status=$?
if ((requeue)); then
    status=0
    wait "$pid" || status=$?  # the trap cut the first wait short: wait for the save
fi
if ((status == 75)); then
    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
fi
exit "$status"
"""
