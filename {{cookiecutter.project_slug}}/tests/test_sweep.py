"""scripts/sweep.py: planning, running, resuming, parallel and SLURM sweeps of tiny runs."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, TINY, flock_failing_with, run_script
from test_locks import NO_LOCKS
from test_tool_cli import signalled_at_import

from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config, save_config, to_dict
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools import (
    cli,
    outputs,
    sweep,
    sweep_cli,
    sweep_launch,
    sweep_manifest,
    sweep_plan,
    sweep_report,
)
from {{ cookiecutter.package_name }}.tools.sweep_report import aggregate
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.utils.logger import record_run

GRID = ["train.lr=1e-3,3e-3", "model.depth=1,2"]
DETERMINISTIC = [*TINY, "run.deterministic=true"]


def sweep_cmd(tmp_path: Path, *args: str) -> list[str]:
    return ["scripts/sweep.py", *args, *DETERMINISTIC, f"run.output_dir={tmp_path}"]


def env() -> dict:
    return {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def results(folder: Path) -> list[dict]:
    with (folder / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def dry_run(capsys, *args: str) -> list[dict]:
    assert sweep_cli.main(ROOT, ["--dry-run", *args, *TINY]) == 0
    return json.loads(capsys.readouterr().out)


def test_grid_plan_has_readable_ids_and_every_combination(capsys):
    trials = dry_run(capsys, "--name", "g", *GRID)
    assert [t["id"] for t in trials] == [
        "t00-lr1e-3-depth1",
        "t01-lr1e-3-depth2",
        "t02-lr3e-3-depth1",
        "t03-lr3e-3-depth2",
    ]
    assert trials[3]["overrides"] == ["train.lr=3e-3", "model.depth=2"]


def test_seeds_plan_runs_each_config_with_consecutive_seeds(capsys):
    trials = dry_run(capsys, "--name", "s", "--seeds", "3", "train.lr=1e-3,3e-3", "run.seed=7")
    assert len(trials) == 6 and len({t["group"] for t in trials}) == 2
    seeds = [o for t in trials[:3] for o in t["overrides"] if o.startswith("run.seed")]
    assert seeds == ["run.seed=7", "run.seed=8", "run.seed=9"]


def test_kfold_plan_runs_every_fold_of_each_config(capsys):
    trials = dry_run(capsys, "--name", "k", "--kfold", "3", "train.lr=1e-3,3e-3")
    assert len(trials) == 6
    for group in ("t00-lr1e-3", "t01-lr3e-3"):
        mine = [t["overrides"] for t in trials if t["group"] == group]
        assert [o[1:] for o in mine] == [["data.folds=3", f"data.fold={i}"] for i in range(3)]


def test_random_search_is_seeded_and_within_the_ranges(capsys):
    ranges = ["train.lr=log:1e-4:1e-2", "model.dropout=uniform:0:0.5", "model.depth=choice:1,3"]
    first = dry_run(capsys, "--name", "r", "--trials", "5", "--seed", "3", *ranges)
    again = dry_run(capsys, "--name", "r", "--trials", "5", "--seed", "3", *ranges)
    assert first == again and len(first) == 5
    for trial in first:
        s = trial["settings"]
        assert 1e-4 <= float(s["train.lr"]) <= 1e-2 and 0 <= float(s["model.dropout"]) <= 0.5
        assert s["model.depth"] in ("1", "3")


def test_aggregation_gives_mean_and_std_over_folds():
    mean, std, n = aggregate([0.5, 0.6, 0.7])
    assert (round(mean, 6), round(std, 6), n) == (0.6, 0.1, 3)
    assert aggregate([0.4]) == (0.4, 0.0, 1)


# In process: scripts/sweep.py is sweep_cli.main and its exit code; the full-disk and
# second-sweep tests below see the same one line and exit 2 from the script itself.
@pytest.mark.parametrize(
    "args, message",
    [
        (["train.lrr=1e-3,3e-3"], "unknown config key 'train.lrr'"),
        (["train.lr=log:1e-4:1e-2"], "add --trials N"),
        (["train.lr=1e-3,-1"], "train.lr must be"),
        (["--name", "a/b", "train.lr=1e-3,3e-3"], "--name must be a folder name"),
    ],
)
def test_bad_input_is_one_error_line_before_anything_runs(tmp_path, capsys, args, message):
    name = [] if "--name" in args else ["--name", "bad"]
    assert sweep_cli.main(ROOT, sweep_cmd(tmp_path, *name, *args)[1:]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def experiment_file(folder: Path) -> Path:
    """An experiment file as users write them: it extends the defaults and changes a few."""
    path = folder / "exp.yaml"
    default = (ROOT / "configs" / "default.yaml").as_posix()
    path.write_text(f"extends: {default}\ntrain:\n  weight_decay: 0.0123\n  grad_clip: 0.5\n")
    return path


def test_a_sweep_of_an_experiment_file_gives_every_trial_the_file(tmp_path, capsys):
    config = experiment_file(tmp_path)
    trials = dry_run(capsys, "--name", "cfg", "--config", str(config), "train.lr=1e-3,2e-3")
    assert [t["id"] for t in trials] == ["t00-lr1e-3", "t01-lr2e-3"]
    smoke = ROOT / "configs" / "experiments" / "smoke.yaml"
    assert len(dry_run(capsys, "--name", "s", "--config", str(smoke), "train.lr=1e-3,2e-3")) == 2


@pytest.mark.slow
def test_a_sweep_with_config_runs_and_its_best_yaml_trains_with_the_file_settings(
    sequential, tmp_path
):
    folder, proc = sequential  # a grid sweep of an experiment file
    assert proc.returncode == 0, proc.stderr
    best = folder / "best.yaml"
    cfg = load_config(best)  # the whole config: the file's settings without the file
    assert (cfg.train.weight_decay, cfg.train.grad_clip) == (0.0123, 0.5)
    assert cfg.train.lr == float(results(folder)[0]["train.lr"])
    # In process: what is tested is that the file trains, not scripts/train.py again.
    again = [f"run.output_dir={tmp_path}", "run.name=from_best", "train.epochs=1"]
    assert train_main(["--config", str(best), *again]) == 0
    ran = load_config(tmp_path / "from_best" / "config.yaml")
    assert (ran.train.weight_decay, ran.train.lr) == (0.0123, cfg.train.lr)


def grid_of_experiment_file(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The grid sweep of an experiment file (--config) that the tests below share."""
    args = sweep_cmd(out, "--name", "g", "--config", str(experiment_file(out)), *extra, *GRID)
    return run_script(*args, env=env(), timeout=300)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("seq")
    return out / "g", grid_of_experiment_file(out)


@pytest.mark.slow
def test_grid_sweep_ranks_its_trials_and_writes_the_best_config(sequential):
    folder, proc = sequential
    assert proc.returncode == 0, proc.stderr
    rows = results(folder)
    values = [float(r["acc_mean"]) for r in rows]
    assert len(rows) == 4 and values == sorted(values, reverse=True)
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    assert [line.split(" | ")[1] for line in table] == [r["trial"] for r in rows]
    best = load_config(folder / "best.yaml")
    assert (best.train.lr, best.model.options.depth) == (
        float(rows[0]["train.lr"]),
        int(rows[0]["model.depth"]),
    )
    assert best.run.name == "g-best" and not best.train.resume
    manifest = json.loads((folder / "sweep.json").read_text())
    assert {t["state"] for t in manifest["trials"]} == {"done"}
    pytest.importorskip("matplotlib", reason="plots are optional: pip install matplotlib")
    for key in ("train.lr", "model.depth"):
        assert (folder / f"metric_vs_{key}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def gpus_of(slots: list[dict]) -> list[str | None]:
    return [slot.get("env", {}).get("CUDA_VISIBLE_DEVICES") for slot in slots]


def test_parallel_counts_the_gpus_in_a_child_process_and_never_touches_cuda(monkeypatch, capsys):
    """--parallel N without --gpus: a child process counts the GPUs (COUNT_GPUS), so that the
    sweep's own never initialises CUDA (torch.cuda.device_count() does where NVML cannot
    count); trials get CUDA_VISIBLE_DEVICES' own entries where it is set."""

    def untouched(*args, **kwargs):
        raise AssertionError("the sweep's process called into CUDA")

    for name in ("device_count", "init", "_lazy_init", "is_available", "current_device"):
        monkeypatch.setattr(torch.cuda, name, untouched)
    monkeypatch.setattr(sweep_launch, "COUNT_GPUS", "print('noise'); print(2)")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus_of(sweep_plan.slots_for(3, None)) == ["0", "1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, 7,9")  # the child sees 2 of them
    assert gpus_of(sweep_plan.slots_for(2, None)) == ["5", "7"]
    assert gpus_of(sweep_plan.slots_for(2, "3")) == ["3", "3"]  # --gpus: nothing counted
    monkeypatch.setattr(sweep_launch, "COUNT_GPUS", "print(0)")
    assert gpus_of(sweep_plan.slots_for(2, None)) == [None, None]  # CPU threads instead
    trials = dry_run(capsys, "--name", "p", "--parallel", "2", "train.lr=1e-3,2e-3")
    assert len(trials) == 2 and not torch.cuda.is_initialized()  # planned, CUDA left alone
    monkeypatch.setattr(sweep_launch, "COUNT_GPUS", "raise SystemExit(1)")
    with pytest.raises(ConfigError, match="could not count the GPUs.*--gpus 0,1"):
        sweep_plan.slots_for(2, None)


def test_a_trial_forked_from_a_process_with_cuda_stops_with_one_line(monkeypatch):
    """The fork guard, observable: in a process forked after CUDA was initialised (torch
    marks it a bad fork), the trial refuses to start instead of failing at CUDA's first
    use."""
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    assert sweep_launch.inherited_cuda() is None
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    line = sweep_launch.inherited_cuda()
    assert line.startswith("error: this trial was forked from a process that had initialised")
    assert "\n" not in line


@pytest.mark.slow
def test_parallel_trials_on_the_gpus_given_say_which_they_start_on(tmp_path):
    """--gpus 0,1 --parallel 2: each trial's started line names its GPU (what a reader of the
    sweep's output checks; on a machine without GPUs the trials train on the CPU all the
    same)."""
    args = sweep_cmd(tmp_path, "--name", "g", "--parallel", "2", "--gpus", "0,1")
    proc = run_script(*args, "train.lr=1e-3,2e-3", "train.epochs=1", env=env())
    assert proc.returncode == 0, proc.stderr
    started = [line for line in proc.stdout.splitlines() if ": started (" in line]
    assert [line.split(" log ")[0].rsplit(" ", 3)[1:] for line in started] == [
        ["on", "GPU", "0"],
        ["on", "GPU", "1"],
    ]


@pytest.mark.slow
def test_parallel_sweep_gives_the_sequential_results(sequential, tmp_path):
    proc = grid_of_experiment_file(tmp_path, "--parallel", "2")
    assert proc.returncode == 0, proc.stderr
    assert results(tmp_path / "g") == results(sequential[0])


@pytest.mark.slow
def test_a_killed_sweep_resumes_its_interrupted_trial_and_a_second_sweep_is_refused(tmp_path):
    # The first trial short, the second long enough to be training when SIGTERM reaches it:
    # its first checkpoint (what the test waits for) comes at the end of epoch 1 of 30.
    args = [a for a in sweep_cmd(tmp_path, "--name", "k") if not a.startswith("train.epochs=")]
    args += ["train.epochs=2,30", "data.train_size=512"]
    job = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    second = tmp_path / "k" / "t01-epochs30"
    deadline = time.monotonic() + 120
    while not list(second.glob("step-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGTERM)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 75, err
    first = tmp_path / "k" / "t00-epochs2"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first.rglob("*") if p.is_file()}
    states = {
        t["id"]: t["state"]
        for t in json.loads((tmp_path / "k" / "sweep.json").read_text())["trials"]
    }
    assert states == {"t00-epochs2": "done", "t01-epochs30": "pending"}

    rerun = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = tmp_path / "k" / "logs" / "t01-epochs30.out"
    deadline = time.monotonic() + 120
    while "resumed at step" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "resumed at step" in log.read_text()
    refused_while_running(args)  # the resumed trial's epochs left keep the rerun running
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert "t00-epochs2: started" not in out
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first.rglob("*") if p.is_file()}
    assert after == before
    manifest = json.loads((tmp_path / "k" / "sweep.json").read_text())
    assert {t["state"] for t in manifest["trials"]} == {"done"}


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue  # gone meanwhile
        if fields.get("PPid", "").strip() == str(pid) and fields.get("State", "")[:1] != "Z":
            found.append(int(status.parent.name))
    return found


def descendants_of(pid: int) -> list[int]:
    """The live processes below `pid` (Linux /proc): a sweep's forkserver and its trials."""
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


def trial_pid(run: Path) -> int:
    """The pid of the process that trains `run`, as its lock file names it."""
    return int((run / ".lock").read_text().split()[3])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_trial_killed_mid_sweep_takes_only_itself_down_and_resumes_on_the_rerun(tmp_path):
    """kill -9 of one trial's process (forked from the sweep on Linux): the sweep records it
    as interrupted, runs the next trial, ends non-zero with it unfinished; the rerun resumes
    it from its last checkpoint and runs nothing else."""
    args = [a for a in sweep_cmd(tmp_path, "--name", "x") if not a.startswith("train.epochs=")]
    args += ["train.epochs=30,2", "data.train_size=512"]
    job = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = tmp_path / "x" / "t00-epochs30"
    wait_for([first / "last.pt"])  # an epoch saved
    os.kill(trial_pid(first), signal.SIGKILL)
    out, err = job.communicate(timeout=180)
    assert job.returncode not in (0, None), out
    assert "t00-epochs30: interrupted (exit -9)" in out and "t01-epochs2: done" in out
    trials = json.loads((tmp_path / "x" / "sweep.json").read_text())["trials"]
    assert [(t["state"], t["exit_code"]) for t in trials] == [("pending", -9), ("done", 0)]
    rerun = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert "t01-epochs2: started" not in rerun.stdout
    assert "resumed at step" in (tmp_path / "x" / "logs" / "t00-epochs30.out").read_text()
    trials = json.loads((tmp_path / "x" / "sweep.json").read_text())["trials"]
    assert {t["state"] for t in trials} == {"done"}


def refused_while_running(args: list[str]) -> None:
    """A second sweep of a folder whose sweep is running is refused: one line, exit 2 (and the
    running one finishes: its caller checks)."""
    second = run_script(*args, env=env())
    assert second.returncode == 2, second.stdout + second.stderr
    err = second.stderr.strip().splitlines()
    assert len(err) == 1 and "is already running in another process" in err[0], err


def wait_for(paths: list[Path], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.exists() for p in paths), [str(p) for p in paths if not p.exists()]


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_makes_its_running_trials_save_and_a_rerun_resumes_them(tmp_path):
    args = sweep_cmd(tmp_path, "--name", "c", "--parallel", "2", "train.lr=1e-3,2e-3,3e-3")
    args += ["data.train_size=4096", "train.epochs=2"]
    # Its own process group, as a terminal's foreground job: Ctrl-C signals the whole group.
    job = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = [tmp_path / "c" / t for t in ("t00-lr1e-3", "t01-lr2e-3")]
    wait_for([run / "config.yaml" for run in started])  # both are training
    os.killpg(job.pid, signal.SIGINT)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 75, err
    assert "sweep stopped (SIGINT)" in out
    trials = json.loads((tmp_path / "c" / "sweep.json").read_text())["trials"]
    assert [(t["state"], t["exit_code"]) for t in trials] == [("pending", 75)] * 2 + [
        ("pending", None)
    ]  # saved and stopped (75), not killed (130); the third never started
    for run in started:  # the sweep passed the stop on as SIGTERM: the trial saved
        log = (tmp_path / "c" / "logs" / f"{run.name}.out").read_text()
        assert (run / "last.pt").exists() and "stopped (SIGTERM) at step" in log

    again = run_script(*args, env=env(), timeout=600)
    assert again.returncode == 0, again.stderr
    for run in started:
        assert "resumed at step" in (tmp_path / "c" / "logs" / f"{run.name}.out").read_text()
    manifest = json.loads((tmp_path / "c" / "sweep.json").read_text())
    assert {t["state"] for t in manifest["trials"]} == {"done"}


@pytest.mark.slow
def test_a_failing_trial_is_recorded_and_the_others_complete(tmp_path):
    # batch 1000 > 256 samples passes the config checks but fails when the run starts. (The
    # swept key only once: a key both swept and set is refused.)
    args = [a for a in sweep_cmd(tmp_path, "--name", "f") if not a.startswith("train.batch_")]
    proc = run_script(*args, "train.batch_size=16,1000", env=env())
    assert proc.returncode == 1, proc.stdout
    trials = json.loads((tmp_path / "f" / "sweep.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["done", "failed"]
    assert trials[1]["exit_code"] == 2 and trials[1]["error"].startswith(
        "error: the effective batch"
    )
    assert "\n" not in trials[1]["error"]


STUBS = {
    "sbatch": '#!/bin/bash\necho "sbatch $*" >> "$STUB_LOG"\necho "Submitted batch job 123"\n',
    "scontrol": '#!/bin/bash\necho "scontrol $*" >> "$STUB_LOG"\n',
}


@pytest.mark.slow
def test_slurm_array_script_is_submitted_and_runs_one_trial_per_task(
    tmp_path, monkeypatch, capsys
):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    log = tmp_path / "stub.log"
    slurm_env = {**env(), "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
                 "STUB_LOG": str(log), "PYTHON": sys.executable}  # fmt: skip
    out = tmp_path / "runs"
    # Submitted in process (sbatch is a stub either way); the array task below is a process.
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    assert sweep_cli.main(ROOT, sweep_cmd(out, "--name", "s", "--slurm", *GRID)[1:]) == 0
    assert "submitted job 123" in capsys.readouterr().out
    script = out / "s" / "sweep_array.sh"
    assert log.read_text().split() == ["sbatch", str(script)]
    text = script.read_text()
    assert "#SBATCH --array=0-3" in text and "#SBATCH --requeue" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0

    task = {**os.environ, **slurm_env, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "123"}
    run = subprocess.run(
        ["bash", str(script)], env=task, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    states = [t["state"] for t in json.loads((out / "s" / "sweep.json").read_text())["trials"]]
    assert states == ["pending", "done", "pending", "pending"]
    assert "scontrol" not in log.read_text()  # finished: no requeue


@pytest.mark.slow
def test_a_3_fold_sweep_reports_mean_and_std_over_disjoint_folds_that_cover_the_pool(tmp_path):
    # One epoch: the folds' counts and the aggregation are the point, not the values.
    args = sweep_cmd(tmp_path, "--name", "cv", "--kfold", "3", "train.epochs=1")
    proc = run_script(*args, env=env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    [row] = results(tmp_path / "cv")
    assert int(row["runs"]) == 3 and float(row["acc_std"]) >= 0
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert "±" in table[-1]
    # Each fold's validation count, from its run's summary: the folds split the 256 samples.
    with (tmp_path / "cv" / "runs.csv").open(newline="") as f:
        counts = sorted(int(r["val_count"]) for r in csv.DictReader(f))
    assert counts == [85, 85, 86] and sum(counts) == 256


# --- Records that survive damage and company -------------------------------------------


def in_process(tmp_path: Path, *args: str) -> int:
    return sweep_cli.main(ROOT, [*args, *TINY, f"run.output_dir={tmp_path}"])


def finished_sweep(tmp_path: Path, capsys, accs: list[float], losses: list[float]) -> Path:
    """A 2x2 grid sweep whose trials look finished (config.yaml, metrics.csv, runs.csv line),
    without the seconds of training: the report reads nothing else."""
    assert in_process(tmp_path, "--name", "g", "--slurm", "--no-submit", *GRID) == 0
    folder = tmp_path / "g"
    manifest = json.loads((folder / "sweep.json").read_text())
    for trial, acc, loss in zip(manifest["trials"], accs, losses, strict=True):
        trial["state"] = "done"
        cfg = load_config(None, [*TINY, *trial["overrides"], f"run.name={trial['id']}"])
        (folder / trial["id"]).mkdir()
        save_config(cfg, folder / trial["id"] / "config.yaml")
        rows = f"epoch,val/loss,val/acc\n1,{loss + 0.5},{acc - 0.1}\n2,{loss},{acc}\n"
        (folder / trial["id"] / "metrics.csv").write_text(rows)
        record_run(folder, {"run": trial["id"], "best_val_acc": acc, "val_loss": loss})
    (folder / "sweep.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    return folder


def ranked(printed: str) -> list[str]:
    return [line.split(" | ")[1] for line in printed.splitlines() if line.startswith("| ")][1:]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "no state", "not utf-8"])
def test_a_damaged_sweep_json_is_one_line_naming_it(tmp_path, capsys, damage):
    assert in_process(tmp_path, "--name", "d", "--slurm", "--no-submit", *GRID) == 0
    path = tmp_path / "d" / "sweep.json"
    text = path.read_text()
    manifest = json.loads(text)
    del manifest["trials"][1]["state"]
    path.write_bytes(
        {
            "garbage": b"{not json",
            "truncated": text[: len(text) // 2].encode(),
            "no state": json.dumps(manifest).encode(),
            "not utf-8": b"\xff\xfe{}",
        }[damage]
    )
    capsys.readouterr()
    assert in_process(tmp_path, "--name", "d", "--report", *GRID) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "sweep.json" in err[0] and "is damaged" in err[0] and "remove it" in err[0]


def test_report_alone_reads_the_sweep_from_its_folder(tmp_path, capsys):
    finished_sweep(tmp_path, capsys, [0.5, 0.7, 0.6, 0.4], [0.5, 0.3, 0.4, 0.6])
    assert sweep_cli.main(ROOT, ["--name", "g", "--report", f"run.output_dir={tmp_path}"]) == 0
    assert ranked(capsys.readouterr().out) == [
        "t01-lr1e-3-depth2", "t02-lr3e-3-depth1", "t00-lr1e-3-depth1", "t03-lr3e-3-depth2"
    ]  # fmt: skip


def test_report_alone_on_a_folder_without_a_sweep_is_one_line(tmp_path, capsys):
    assert sweep_cli.main(ROOT, ["--name", "nope", "--report", f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no sweep 'nope'" in err[0], err
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("config", ["train: [unclosed\n", "train:\n  lrr: 1\n", b"\xff\xfe"])
def test_report_skips_a_trial_whose_config_no_longer_parses(tmp_path, capsys, config):
    folder = finished_sweep(tmp_path, capsys, [0.5, 0.7, 0.6, 0.4], [0.5, 0.3, 0.4, 0.6])
    path = folder / "t01-lr1e-3-depth2" / "config.yaml"
    path.write_bytes(config if isinstance(config, bytes) else config.encode())
    assert in_process(tmp_path, "--name", "g", "--report", *GRID) == 0
    out, err = capsys.readouterr()
    assert err.count("t01-lr1e-3-depth2: skipped") == 1 and "config.yaml" in err, err
    assert ranked(out)[:3] == ["t02-lr3e-3-depth1", "t00-lr1e-3-depth1", "t03-lr3e-3-depth2"]
    assert "Traceback" not in err


def test_tied_results_are_ranked_by_the_next_metric_and_said_to_tie(tmp_path, capsys):
    folder = finished_sweep(tmp_path, capsys, [0.5] * 4, [0.9, 0.3, 0.7, 0.5])
    assert in_process(tmp_path, "--name", "g", "--report", *GRID) == 0
    out = capsys.readouterr().out
    # acc ties: val loss decides, lower first
    assert ranked(out) == [
        "t01-lr1e-3-depth2", "t03-lr3e-3-depth2", "t02-lr3e-3-depth1", "t00-lr1e-3-depth1"
    ]  # fmt: skip
    assert "4 configs tie on acc (0.5000); ranked by val loss (min)" in out
    assert [r["trial"] for r in results(folder)] == ranked(out)
    assert "lr: 0.001\n" in (folder / "best.yaml").read_text()  # t01's, not t00's


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.lr=1e-3,3e-3", "train.lr=1e-2,2e-2"], "train.lr is given twice"),
        (["train.lr=1e-3", "train.lr=1e-2,2e-2"], "train.lr is given twice"),
        (["--seeds", "2", "run.seed=1,2"], "run.seed is given twice"),
        (["--kfold", "2", "data.fold=0,1"], "data.fold is given twice"),
        (["--parallel", "0", "train.lr=1e-3,3e-3"], "--parallel must be >= 1"),
        (["--run-index", "7", "train.lr=1e-3,3e-3"], "--run-index 7 is not in 0..1"),
    ],
)
def test_a_refused_sweep_writes_nothing(tmp_path, capsys, args, message):
    assert in_process(tmp_path, "--name", "r", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not any(tmp_path.iterdir())


def test_slurm_without_sbatch_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # an empty PATH: no sbatch on it
    assert in_process(tmp_path, "--name", "s", "--slurm", "train.lr=1e-3,3e-3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: sbatch not found: run on a SLURM login node, or use --no-submit"]
    assert not any(tmp_path.iterdir())


def _file_size_limit(limit: int):
    def limit_writes():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_writes


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_leaves_no_half_written_sweep_json(tmp_path):
    # A file-size limit fails the write as a full disk does (EFBIG instead of ENOSPC).
    args = sweep_cmd(tmp_path, "--name", "full", *GRID)
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env()}, capture_output=True,
        text=True, timeout=120, preexec_fn=_file_size_limit(200),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot use ") and "sweep.json" in err[0]
    # no sweep.json, no temporary file, no trial started
    left = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert left == [".sweep.lock", ".sweep.run.lock"]


def test_slurm_array_tasks_share_the_sweep_lock_that_a_whole_sweep_takes_alone(tmp_path):
    tasks = [sweep_manifest.hold_sweep(tmp_path, one_trial=True) for _ in range(2)]
    with pytest.raises(ConfigError, match="is already running in another process"):
        sweep_manifest.hold_sweep(tmp_path, one_trial=False)
    for fd in tasks:
        os.close(fd)
    whole = sweep_manifest.hold_sweep(tmp_path, one_trial=False)
    with pytest.raises(ConfigError, match="is already running in another process"):
        sweep_manifest.hold_sweep(tmp_path, one_trial=True)
    os.close(whole)


# --- Trials that stand in for train.py ---------------------------------------------------
# The sweep's own decisions (what to start, resume, record, refuse) in process and in about a
# second: each trial is a small script, not a training run. It does what FAKE_TRIALS says for
# its run name (the first key it starts with, else "*"), and appends to calls.jsonl what ran.
FAKE_TRIAL = """
import json, os, shutil, signal, sys, time
from pathlib import Path
from {{ cookiecutter.package_name }}.utils.logger import record_run  # no torch: it starts fast

settings = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("--"))
name, lr = settings["run.name"], float(settings.get("train.lr", 1e-3))
run = Path(settings["run.output_dir"]) / name
plan = json.loads(os.environ["FAKE_TRIALS"])
action = next((v for k, v in plan.items() if name.startswith(k)), plan["*"])
if action == "hang":  # a stuck trial: a stop is noted, never acted on
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({"run": name, "lr": lr, "action": action, "pid": os.getpid()}) + "\\n")
if action == "enospc":  # what train.py prints for a full disk
    print(f"error: cannot use '{run}/step-1.pt': {os.strerror(28)}; free space", file=sys.stderr)
    sys.exit(2)
if action == "fail":
    print("error: injected failure inside a trial", file=sys.stderr)
    sys.exit(1)
if action == "exit0":  # ends before training, with the code of success
    sys.exit(0)
if action == "sigkill":  # as the kernel's out-of-memory killer ends a process
    os.kill(os.getpid(), signal.SIGKILL)
run.mkdir(parents=True, exist_ok=True)
shutil.copy(os.environ["FAKE_CONFIG"], run / "config.yaml")  # what the report reads
acc = min(lr * 100, 1.0)  # a result that depends on the settings
rows = "".join(f"{e},{16 * e},{acc * e / 2},{1 - acc}\\n" for e in (1, 2))
(run / "metrics.csv").write_text("epoch,step,val/acc,val/loss\\n" + rows)
(run / "last.pt").write_bytes(b"")  # saved: what a finished run (and a stopped one) has
while action == "hang":
    time.sleep(1)
if action == "stopped":  # saved and stopped (SIGTERM)
    sys.exit(75)
record_run(run.parent, {"run": name, "best_val_acc": acc, "val_loss": 1 - acc})
"""


def fake_trials(monkeypatch, tmp_path: Path, plan: dict) -> Path:
    """From now on the sweep's trials run FAKE_TRIAL with `plan`; returns its calls file."""
    script, config = tmp_path / "fake_trial.py", tmp_path / "fake_config.yaml"
    script.write_text(FAKE_TRIAL)
    save_config(load_config(None, TINY), config)
    calls = tmp_path / "calls.jsonl"

    def command(self, trial):
        return [sys.executable, str(script), *self.overrides(trial)]

    monkeypatch.setattr(sweep.Sweep, "command", command)
    monkeypatch.setattr(sweep_report, "available", lambda: False)  # no plots: seconds less
    for key, value in {"TRIALS": json.dumps({"*": "done", **plan}), "CALLS": calls,
                       "CONFIG": config}.items():  # fmt: skip
        monkeypatch.setenv(f"FAKE_{key}", str(value))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return calls


def calls_of(calls: Path) -> list[dict]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_trial_that_cannot_write_stops_the_sweep_and_is_retried_by_the_rerun(
    tmp_path, monkeypatch, capsys
):
    calls = fake_trials(monkeypatch, tmp_path, {"*": "enospc"})
    out, grid = tmp_path / "out", "train.lr=1e-3,2e-3,3e-3"
    assert in_process(out, "--name", "g", grid) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "t00-lr1e-3" in line and "No space left on device" in line
    assert "run the same command again" in line
    assert [c["run"] for c in calls_of(calls)] == ["t00-lr1e-3"]  # none started after it
    trials = json.loads((out / "g" / "sweep.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["pending"] * 3  # the first one to retry

    fake_trials(monkeypatch, tmp_path, {})  # space freed
    assert in_process(out, "--name", "g", grid) == 0
    trials = json.loads((out / "g" / "sweep.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["done"] * 3
    assert [c["run"] for c in calls_of(calls)].count("t00-lr1e-3") == 2


SAME_SETTINGS = ("a comment", "what it overrides, in the file it extends")


@pytest.mark.parametrize("edit", ["its own settings", "the file it extends", *SAME_SETTINGS])
def test_a_sweep_refuses_to_continue_after_its_config_file_changed(tmp_path, capsys, edit):
    """The digest is of the settings load_config reads from the file (config.file_settings),
    not of each file's text: what changes no setting is no change."""
    base = tmp_path / "base.yaml"
    base.write_text("train:\n  weight_decay: 0.01\n")
    config = tmp_path / "exp.yaml"
    config.write_text("extends: base.yaml\ntrain:\n  grad_clip: 0.5\n")
    args = ["--name", "c", "--config", str(config), "--slurm", "--no-submit", *GRID]
    assert in_process(tmp_path, *args) == 0
    records = {p: p.read_bytes() for p in (tmp_path / "c").iterdir() if p.is_file()}
    if edit == "its own settings":
        config.write_text("extends: base.yaml\ntrain:\n  grad_clip: 0.25\n")
    elif edit == "the file it extends":
        base.write_text("train:\n  weight_decay: 0.02\n")
    elif edit == "a comment":  # the same settings: the trials train the same models
        config.write_text("extends: base.yaml\n# clipped\ntrain: {grad_clip: 0.5}\n")
    else:  # exp.yaml's grad_clip still wins
        base.write_text("train:\n  weight_decay: 0.01\n  grad_clip: 2.0\n")
    capsys.readouterr()
    if edit in SAME_SETTINGS:
        assert in_process(tmp_path, *args) == 0
        return
    assert in_process(tmp_path, *args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--config file" in line and "put the file back" in line, line
    assert {p: p.read_bytes() for p in (tmp_path / "c").iterdir() if p.is_file()} == records


def test_a_config_file_edited_while_the_sweep_runs_stops_it_before_its_next_trial(
    tmp_path, monkeypatch, capsys
):
    calls = fake_trials(monkeypatch, tmp_path, {})
    config = tmp_path / "exp.yaml"
    config.write_text("train:\n  grad_clip: 0.5\n")
    finish = sweep.Sweep._finish

    def finish_then_edit(self, *args):  # the user edits the file for the next experiment
        finish(self, *args)
        config.write_text("train:\n  grad_clip: 0.25\n")

    monkeypatch.setattr(sweep.Sweep, "_finish", finish_then_edit)
    args = ["--name", "e", "--config", str(config), "train.lr=1e-3,2e-3"]
    assert in_process(tmp_path, *args) == 2
    assert "changed while the sweep ran" in one_error_line(capsys.readouterr().err)
    assert [c["run"] for c in calls_of(calls)] == ["t00-lr1e-3"]
    trials = json.loads((tmp_path / "e" / "sweep.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["done", "pending"]


class Stopped(Exception):
    """A stop signal that no handler of the sweep caught (it would have ended pytest)."""


@pytest.fixture
def stop_signals_raise():
    """While the test runs, SIGTERM raises Stopped instead of ending pytest, and SIGINT raises
    KeyboardInterrupt (as in any Python process): what a sweep must not let happen."""

    def stopped(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, stopped), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGINT, previous[1])


def stop_inside(monkeypatch, module, name: str, sig: int) -> None:
    """`module.name` sends `sig` to this process, then does what it did: a stop that lands
    at that moment."""
    original = getattr(module, name)

    def stopping(*args, **kwargs):
        os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, stopping)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_sweep_starts_ends_it_before_its_first_trial(
    tmp_path, monkeypatch, capsys, stop_signals_raise, sig
):
    calls = fake_trials(monkeypatch, tmp_path, {})
    stop_inside(monkeypatch, sweep_manifest, "hold_sweep", sig)  # after its checks
    assert in_process(tmp_path, "--name", "s", *GRID) == 75
    out, err = capsys.readouterr()
    assert not calls_of(calls) and "Traceback" not in err
    assert out.endswith("run the same command again to continue (%s)\n" % (tmp_path / "s"))
    assert f"sweep stopped ({signal.Signals(sig).name})" in out
    trials = json.loads((tmp_path / "s" / "sweep.json").read_text())["trials"]
    assert {t["state"] for t in trials} == {"pending"}


def test_a_stop_the_script_held_before_its_imports_ends_the_sweep_before_its_first_trial(
    tmp_path, monkeypatch, capsys, stop_signals_raise
):
    """scripts/sweep.py holds stop signals from before its imports (cli.hold_signals, as the
    tools do): one noted then is the sweep's to act on."""
    calls = fake_trials(monkeypatch, tmp_path, {})
    cli._held.append(signal.SIGTERM)  # what hold_signals() notes while the sweep imports
    assert in_process(tmp_path, "--name", "s", *GRID) == 75
    assert not calls_of(calls) and "sweep stopped (SIGTERM)" in capsys.readouterr().out
    assert cli._held == []  # taken over by the sweep


def test_a_stop_during_the_report_lets_the_report_finish(
    tmp_path, monkeypatch, capsys, stop_signals_raise
):
    folder = finished_sweep(tmp_path, capsys, [0.5, 0.7, 0.6, 0.4], [0.5, 0.3, 0.4, 0.6])
    stop_inside(monkeypatch, sweep_report, "table", signal.SIGTERM)
    assert in_process(tmp_path, "--name", "g", "--report", *GRID) == 0
    out = capsys.readouterr().out  # the whole of it, to its last line's end
    assert out.endswith(f"its config: {folder / 'best.yaml'}\n")
    assert (folder / "best.yaml").exists() and (folder / "results.csv").exists()


def test_sweep_records_are_run_files_and_common_names_elsewhere_are_not(tmp_path):
    sweep = tmp_path / "lrs"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    for name in ("results.csv", "best.yaml", "study.db", "sweep_array.sh", "runs.csv"):
        assert outputs.run_file(sweep / name), name
    assert outputs.run_file(sweep / "logs" / "slurm-1_0.out")
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("results.csv", "best.yaml"):
        assert outputs.run_file(plain / name) is None, name
    for name in ("sweep.json", "study.db", "study.db-wal", ".sweep.lock", ".sweep.run.lock"):
        assert outputs.run_file(plain / name), name  # their names say what they are


def test_a_sweep_manifest_is_written_on_a_filesystem_without_locks(tmp_path, monkeypatch, capsys):
    flock_failing_with(monkeypatch, OSError(errno.ENOLCK, "No locks available"))
    args = sweep_cli._parser().parse_args(
        ["--name", "nl", "train.lr=1e-3,3e-3", "run.device=cpu", f"run.output_dir={tmp_path}"]
    )
    made = sweep.Sweep.create(ROOT, args)
    made.update(made.trials[0], state="done", exit_code=0)
    again = sweep.Sweep.create(ROOT, args)  # a rerun reads the recorded state
    assert [t["state"] for t in again.trials] == ["done", "pending"]
    assert NO_LOCKS in capsys.readouterr().out


def test_a_trial_s_run_folder_is_busy_while_a_process_holds_it_on_nfs(tmp_path, nfs_flock):
    """The sweep's check of a trial's run folder takes a lock NFS grants (no EBADF), and a run
    folder another process holds still reads as busy."""
    run = tmp_path / "a"
    folder = RunFolder(run, keep_last=1)
    # What training holds (and a trial that a killed sweep left behind). flock locks belong to
    # an open file, so run_busy's own descriptor meets it as another process's would.
    folder.lock()
    assert sweep_manifest.run_busy(run) is True
    folder.unlock()
    assert sweep_manifest.run_busy(run) is False


@pytest.mark.slow
def test_a_signal_while_the_sweep_script_imports_stops_it_before_its_first_trial(tmp_path):
    """scripts/sweep.py holds the stop signals as the tools do, from before it imports the
    sweep (here: the signal comes as sweep_cli is imported): the sweep acts on it."""
    args = ["--name", "s", "train.lr=1e-3,3e-3", *TINY, f"run.output_dir={tmp_path}"]
    proc = signalled_at_import("{{ cookiecutter.package_name }}.tools.sweep_cli", "sweep.py", *args)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert "sweep stopped (SIGTERM)" in proc.stdout and "Traceback" not in proc.stderr
    trials = json.loads((tmp_path / "s" / "sweep.json").read_text())["trials"]
    assert {t["state"] for t in trials} == {"pending"}
    assert not (tmp_path / "s" / "logs").exists()  # no trial started


def test_best_yaml_names_its_run_after_the_sweep(tmp_path):
    sweep = tmp_path / "lrs"
    sweep.mkdir()
    trial = yaml.safe_load(yaml.safe_dump(to_dict(load_config(None, ["run.name=t00"]))))
    best = {"group": "t00", "configs": {"t00": trial}, "mean": 0.9, "std": 0.0, "n": 1}
    sweep_report._write_best(sweep, best)
    assert load_config(sweep / "best.yaml").run.name == "lrs-best"


def test_the_freeze_epochs_and_backbone_lr_ratio_are_sweepable(capsys):
    grid = ["--name", "ft", "train.freeze_epochs=0,1", "train.backbone_lr_ratio=0.1,0.5"]
    trials = dry_run(capsys, *grid)
    assert [t["overrides"] for t in trials] == [
        [f"train.freeze_epochs={f}", f"train.backbone_lr_ratio={r}"]
        for f in ("0", "1")
        for r in ("0.1", "0.5")
    ]


# --- Trials that crash, lie, hang or outlive their sweep: the record says what happened ------


def states_of(folder: Path) -> list[tuple]:
    trials = sweep_manifest.read(folder / "sweep.json")["trials"]
    return [(t["state"], t["exit_code"]) for t in trials]


def test_a_trial_killed_by_a_signal_twice_in_a_row_is_failed_with_one_line(
    tmp_path, monkeypatch, capsys
):
    """The kernel's out-of-memory killer sends SIGKILL at every try: the first kill leaves the
    trial to resume, the second in a row fails it (it used to be pending at every rerun)."""
    calls = fake_trials(monkeypatch, tmp_path, {"t00": "sigkill"})
    grid = "train.lr=1e-3,2e-3"
    assert in_process(tmp_path, "--name", "oom", grid) == 75
    assert states_of(tmp_path / "oom") == [("pending", -9), ("done", 0)]
    capsys.readouterr()
    assert in_process(tmp_path, "--name", "oom", grid) == 1
    out, err = capsys.readouterr()
    [line] = [x for x in out.splitlines() if x.startswith("t00-lr1e-3: failed")]
    assert "killed by SIGKILL 2 times in a row" in line and "out-of-memory" in line, out
    assert "1 trial(s) failed: t00-lr1e-3" in err
    [record, _] = sweep_manifest.read(tmp_path / "oom" / "sweep.json")["trials"]
    assert (record["state"], record["kills"]) == ("failed", 2) and "SIGKILL" in record["error"]
    assert [c["run"] for c in calls_of(calls)] == ["t00-lr1e-3", "t01-lr2e-3", "t00-lr1e-3"]

    fake_trials(monkeypatch, tmp_path, {})  # memory freed: the rerun retries it, as any failure
    assert in_process(tmp_path, "--name", "oom", grid) == 0
    assert states_of(tmp_path / "oom") == [("done", 0), ("done", 0)]


def test_the_stop_line_counts_a_trial_killed_by_a_signal(tmp_path, monkeypatch, capsys):
    fake_trials(monkeypatch, tmp_path, {"t00": "sigkill"})
    assert in_process(tmp_path, "--name", "k", "train.lr=1e-3,2e-3") == 75
    last = capsys.readouterr().out.strip().splitlines()[-1]
    said = "sweep stopped: 0 trial(s) saved and stopped, 1 interrupted (t00-lr1e-3), 0 not started"
    assert last.startswith(f"{said}; run the same command again"), last


def test_a_trial_that_exits_0_without_finishing_its_run_is_failed(tmp_path, monkeypatch, capsys):
    fake_trials(monkeypatch, tmp_path, {"t00": "exit0"})
    grid = "train.lr=1e-3,2e-3"
    assert in_process(tmp_path, "--name", "z", grid) == 1
    out, err = capsys.readouterr()
    [line] = [x for x in out.splitlines() if x.startswith("t00-lr1e-3:") and "started" not in x]
    assert "failed: it exited 0 without finishing its run (no last.pt and no row in runs.csv" in (
        line
    )
    assert "1 trial(s) failed: t00-lr1e-3" in err
    assert states_of(tmp_path / "z") == [("failed", 0), ("done", 0)]
    fake_trials(monkeypatch, tmp_path, {})
    assert in_process(tmp_path, "--name", "z", grid) == 0  # retried by the rerun
    assert states_of(tmp_path / "z") == [("done", 0), ("done", 0)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")  # a zombie (ended, not yet reaped) is not alive
    return not status.exists() or "State:\tZ" not in status.read_text()


def started_pid(calls: Path, run: str, seconds: float = 30) -> int:
    """The pid of stand-in trial `run` once it started (its calls line)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [c["pid"] for c in calls_of(calls) if c["run"] == run]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"trial {run} did not start within {seconds}s")


class Bounded:
    """For a test of a sweep that must not hang: `bound` seconds after it starts, SIGKILL the
    stand-in trials still running (their pids from the calls file), so that a sweep waiting
    for one returns and the test fails instead of waiting for ever."""

    def __init__(self, calls: Path, bound: float):
        import threading

        self.calls, self.hit = calls, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bound,), daemon=True)
        self._thread.start()

    def _run(self, bound: float) -> None:
        if self._done.wait(bound):
            return
        self.hit = True
        for pid in {c["pid"] for c in calls_of(self.calls)}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        self._done.set()
        self._thread.join()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_trial_that_cannot_stop_is_killed_a_grace_period_after_a_stop(
    tmp_path, monkeypatch, capsys, stop_signals_raise
):
    """SIGTERM to a sweep whose trial cannot reach a step boundary: the sweep used to wait for
    ever. Now the trial's process group gets SIGKILL after the grace period (--stop-grace),
    with a line, and it stays to resume from its last checkpoint."""
    import threading

    calls = fake_trials(monkeypatch, tmp_path, {"t00": "hang"})
    monkeypatch.setattr(sweep, "STOP_GRACE_S", 1.0, raising=False)  # the default's 120 s
    bounded = Bounded(calls, 30)

    def stop_when_it_runs():
        started_pid(calls, "t00-lr1e-3")
        os.kill(os.getpid(), signal.SIGTERM)  # the sweep's handler notes it

    stopper = threading.Thread(target=stop_when_it_runs, daemon=True)
    stopper.start()
    began = time.monotonic()
    try:
        code = in_process(tmp_path, "--name", "h", "train.lr=1e-3,2e-3")
    finally:
        bounded.close()
        stopper.join(5)
    assert not bounded.hit and code == 75, capsys.readouterr()
    assert time.monotonic() - began < 20
    out = capsys.readouterr().out
    assert "t00-lr1e-3: did not stop within 1s of being asked: killed (SIGKILL" in out, out
    assert "1 interrupted (t00-lr1e-3), 1 not started" in out.strip().splitlines()[-1]
    assert states_of(tmp_path / "h") == [("pending", -9), ("pending", None)]
    assert not pid_alive(started_pid(calls, "t00-lr1e-3"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_trial_over_its_time_limit_is_stopped_and_failed_and_the_others_run(
    tmp_path, monkeypatch, capsys
):
    calls = fake_trials(monkeypatch, tmp_path, {"t00": "hang"})
    bounded = Bounded(calls, 30)
    try:
        args = ["--trial-timeout", "1", "--stop-grace", "1", "train.lr=1e-3,2e-3"]
        code = in_process(tmp_path, "--name", "t", *args)
    finally:
        bounded.close()
    out, err = capsys.readouterr()
    assert not bounded.hit and code == 1, out + err
    assert "t00-lr1e-3: ran for --trial-timeout 1s: asked to save and stop" in out
    assert "t00-lr1e-3: did not stop within 1s of being asked: killed" in out
    assert states_of(tmp_path / "t") == [("failed", -9), ("done", 0)]
    record = sweep_manifest.read(tmp_path / "t" / "sweep.json")["trials"][0]
    assert "--trial-timeout 1s" in record["error"]
    assert not pid_alive(started_pid(calls, "t00-lr1e-3"))


# Runs a sweep of stand-in trials (test_sweep.FAKE_TRIAL, from fake_trials' environment) as
# a process of its own: argv[1] is the stand-in script, the rest the sweep's arguments.
SWEEP_OF_STAND_INS = """
import sys
from pathlib import Path
from {{ cookiecutter.package_name }}.tools import sweep, sweep_cli

script = sys.argv[1]
sweep.Sweep.command = lambda self, trial: [sys.executable, script, *self.overrides(trial)]
sweep.STOP_GRACE_S = 2.0  # the grace period's default, 120 s, shortened
raise SystemExit(sweep_cli.main(Path.cwd(), sys.argv[2:]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_stuck_trial_does_not_outlive_its_sweep_killed_with_kill_9(tmp_path, monkeypatch):
    """After kill -9 of the sweep, its trial gets SIGTERM (parent death) and cannot act on
    it: it used to live on as an orphan. The sweep's watchdog ends it after the grace period."""
    calls = fake_trials(monkeypatch, tmp_path, {"t00": "hang"})
    args = ["--name", "o", "train.lr=1e-3,2e-3", *TINY]
    job = subprocess.Popen(
        [sys.executable, "-c", SWEEP_OF_STAND_INS, str(tmp_path / "fake_trial.py"), *args,
         f"run.output_dir={tmp_path}"],
        cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    pid = None
    try:
        pid = started_pid(calls, "t00-lr1e-3")
        job.kill()
        job.wait(10)
        deadline = time.monotonic() + 20
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid), "the stuck trial outlived its sweep"
        log = (tmp_path / "o" / "logs" / "t00-lr1e-3.out").read_text()
        assert "its sweep died and it did not stop within 2s" in log, log
    finally:
        if job.poll() is None:
            job.kill()
        if pid is not None and pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        job.communicate(timeout=10)


# A caller that has used torch's OpenMP pool (a notebook, a test suite), then runs a sweep in
# its own process: a trial forked from it hung for ever (GNU OpenMP is not fork-safe). A
# script with no __main__ guard: were it imported again in a trial, it would sweep again.
OPENMP_CALLER = """
import sys
from pathlib import Path

import torch

torch.set_num_threads(2)  # the OpenMP pool exists
a = torch.randn(1500, 1500)
print("computed", float((a @ a).sum()) != 0.0)
from {{ cookiecutter.package_name }}.tools.sweep_cli import main

code = main(Path(sys.argv[1]), sys.argv[2:])
print("sweep exit", code)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_sweep_called_in_process_after_torch_computed_does_not_hang(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(OPENMP_CALLER)
    args = ["--name", "omp", "train.lr=1e-3,3e-3", *TINY, "train.epochs=1"]
    job = subprocess.Popen(
        [sys.executable, str(caller), str(ROOT), *args, f"run.output_dir={tmp_path}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = job.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        left = descendants_of(job.pid)  # the hung trial is in a session of its own
        for pid in [job.pid, *left]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, _ = job.communicate(timeout=10)
        pytest.fail(f"the sweep hung (its trial forked after OpenMP ran):\n{out}")
    assert job.returncode == 0 and "sweep exit 0" in out, out
    assert out.count("computed True") == 1, out  # the caller's script ran once, not per trial
    assert states_of(tmp_path / "omp") == [("done", 0), ("done", 0)]
