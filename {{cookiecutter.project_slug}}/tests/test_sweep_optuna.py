"""scripts/sweep.py --optuna: a real study (TPE, median pruning) that stops and continues, and
one line without the optional package."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_script

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools import sweep_cli

INSTALL = "pip install -e '.[sweep]'"
# A good learning rate and one that learns nothing: the second falls below the median. With
# --seed 6 the first start samples 0.05 twice, the second start 1e-9 first (TPE samples at
# random, seeded, before its 10th trial): a useless trial after two finished ones.
LRS = "train.lr=choice:0.05,1e-9"


def optuna_args(tmp_path: Path, n: int, *extra: str) -> list[str]:
    return [
        "--name", "o", "--optuna", str(n), "--seed", "6", "--prune-after", "1", LRS,
        *TINY, "train.epochs=3", "run.deterministic=true", f"run.output_dir={tmp_path}", *extra,
    ]  # fmt: skip


def test_without_optuna_the_refusal_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what a missing package looks like
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and INSTALL in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--parallel", "2"], "--parallel does not go with --optuna"),
        (["--seeds", "2"], "--seeds does not go with --optuna"),
        (["train.lr=1e-3"], "train.lr is given twice"),
    ],
)
def test_optuna_refuses_what_it_does_not_take_before_writing(tmp_path, capsys, extra, message):
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_an_optuna_study_prunes_continues_to_n_trials_and_reports(tmp_path):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    env = {"OMP_NUM_THREADS": "1"}
    folder = tmp_path / "o"
    first = run_script("scripts/sweep.py", *optuna_args(tmp_path, 2), env=env, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    trials = json.loads((folder / "sweep.json").read_text())["trials"]
    assert len(trials) == 2 and {t["state"] for t in trials} == {"done"}

    # The same command with a larger N continues the study: the finished trials stay. One
    # more is enough: with --seed 6 it is the useless lr (see LRS), pruned.
    again = run_script("scripts/sweep.py", *optuna_args(tmp_path, 3), env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(f"{t['id']}: started" not in again.stdout for t in trials)
    trials = json.loads((folder / "sweep.json").read_text())["trials"]
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{folder / 'study.db'}")
    assert len(trials) == len(study.trials) == 3
    states = {t["settings"]["train.lr"]: set() for t in trials}
    for trial, recorded in zip(trials, study.trials, strict=True):
        assert trial["number"] == recorded.number
        states[trial["settings"]["train.lr"]].add((trial["state"], recorded.state.name))
    assert ("pruned", "PRUNED") in states["1e-9"], states  # the useless lr is cut short
    assert states["0.05"] == {("done", "COMPLETE")}, states
    with (folder / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and rows[0]["train.lr"] == "0.05"
    assert load_config(folder / "best.yaml").train.lr == 0.05
    assert "| rank | trial | train.lr |" in again.stdout


@pytest.mark.slow
def test_a_stopped_optuna_sweep_resumes_its_interrupted_trial(tmp_path):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    # Epochs enough that the trial is still training when the stop reaches it: its first
    # checkpoint (what the test waits for) comes at the end of epoch 1 of 8.
    longer = ("data.train_size=1024", "train.epochs=8")
    args = [sys.executable, "scripts/sweep.py", *optuna_args(tmp_path, 2, *longer)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(
        args, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    folder = tmp_path / "o"
    deadline = time.monotonic() + 120
    while not list(folder.glob("t000-*/step-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGTERM)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 75, out + err
    [trial] = json.loads((folder / "sweep.json").read_text())["trials"]
    assert (trial["state"], trial["exit_code"]) == ("pending", 75)

    again = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed at step" in (folder / "logs" / f"{trial['id']}.out").read_text()
    trials = json.loads((folder / "sweep.json").read_text())["trials"]
    assert [(t["id"], t["state"]) for t in trials][0] == (trial["id"], "done")
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{folder / 'study.db'}")
    # The stopped trial failed in the study; its settings were asked again and finished.
    assert [t.state.name for t in study.trials][:2] == ["FAIL", "COMPLETE"]
    assert len(study.trials) == 3 and len(trials) == 2  # then one new trial, to 2 in all
    assert study.trials[1].params == study.trials[0].params and trials[0]["number"] == 1
