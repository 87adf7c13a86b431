"""scripts/sweep.py --optuna: a real study (TPE, median pruning) that stops and continues, one
line without the optional package or for a study.db that cannot be used, and a study that
agrees with sweep.json after the sweep was killed, a write failed or study.db was removed."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_script
from test_sweep import (
    calls_of,
    fake_trials,
    one_error_line,
    stop_inside,
    stop_signals_raise,  # noqa: F401  (a fixture)
)

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools import sweep, sweep_cli, sweep_manifest, sweep_optuna

INSTALL = "pip install -e '.[sweep]'"
# A good learning rate and one that learns nothing: the second falls below the median. With
# --seed 6 the first start samples 0.05 twice, the second start 1e-9 first (TPE samples at
# random, seeded, before its 10th trial): a useless trial after two finished ones. Its
# first epoch's value must reach the pruner (polled every 0.2 s) before the trial ends: 12
# epochs leave that time on a loaded machine (with 3, CI's 2 busy cores missed it).
LRS = "train.lr=choice:0.05,1e-9"


def optuna_args(tmp_path: Path, n: int, *extra: str) -> list[str]:
    return [
        "--name", "o", "--optuna", str(n), "--seed", "6", "--prune-after", "1", LRS,
        *TINY, "train.epochs=12", "run.deterministic=true", f"run.output_dir={tmp_path}", *extra,
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


# --- In process, with trials that stand in for train.py (test_sweep.FAKE_TRIAL) ------------


def records(folder: Path) -> list[dict]:
    return json.loads((folder / "sweep.json").read_text())["trials"]


def load_study(folder: Path):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    return optuna.load_study(study_name="o", storage=f"sqlite:///{folder / 'study.db'}")


# Trials that stand in for train.py finish between two looks of the pruner, or not: no pruning.
UNPRUNED = ("--prune-after", "99")


class Killed(BaseException):
    """The sweep process ends here, as under kill -9: nothing after it runs."""


def test_a_trial_left_running_by_a_killed_sweep_is_resumed_with_the_same_settings(
    tmp_path, monkeypatch
):
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    # The sweep dies while its trial trains; the trial gets SIGTERM (stop_with_parent),
    # saves and stops; nobody records how it ended.
    calls = fake_trials(monkeypatch, tmp_path, {"t000": "stopped"})
    with monkeypatch.context() as m:
        m.setattr(sweep.Sweep, "_finish", lambda self, *args: (_ for _ in ()).throw(Killed))
        with pytest.raises(Killed):
            sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED))
    folder = tmp_path / "o"
    [left] = records(folder)
    assert left["state"] == "running" and load_study(folder).trials[0].state.name == "RUNNING"

    fake_trials(monkeypatch, tmp_path, {})
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 0
    trials = records(folder)
    assert [(t["id"], t["state"]) for t in trials][0] == (left["id"], "done")
    assert len(trials) == 2 and trials[1]["state"] == "done"  # N counts finished trials
    ran = [c["lr"] for c in calls_of(calls) if c["run"] == left["id"]]
    assert len(ran) == 2 and ran[0] == ran[1]  # resumed with its own settings
    study = load_study(folder)
    # The dead sweep's trial failed in the study; its settings were asked again and finished.
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert study.trials[1].params == study.trials[0].params == left["params"]
    assert [t["number"] for t in trials] == [1, 2]


def test_a_trial_that_finished_as_its_sweep_was_killed_is_told_to_the_study_not_rerun(
    tmp_path, monkeypatch
):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    calls = fake_trials(monkeypatch, tmp_path, {})
    with monkeypatch.context() as m:  # dies after sweep.json says done, before the study knows
        m.setattr(optuna.study.Study, "tell", lambda *args, **kw: (_ for _ in ()).throw(Killed))
        with pytest.raises(Killed):
            sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED))
    folder = tmp_path / "o"
    [done] = records(folder)
    assert done["state"] == "done" and load_study(folder).trials[0].state.name == "RUNNING"

    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 0
    study = load_study(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert study.trials[0].value == 1.0  # its result (runs.csv), as the fake trial reported
    assert [c["run"] for c in calls_of(calls)].count(done["id"]) == 1


def test_a_trial_that_cannot_write_stops_the_study_and_is_retried_by_the_rerun(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    calls = fake_trials(monkeypatch, tmp_path, {"*": "enospc"})
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and "run the same command again" in line
    folder = tmp_path / "o"
    [trial] = records(folder)  # the study stopped at it: no second trial into the full disk
    assert trial["state"] == "pending" and len(calls_of(calls)) == 1

    fake_trials(monkeypatch, tmp_path, {})  # space freed
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 0
    trials = records(folder)
    assert [(t["id"], t["state"]) for t in trials][0] == (trial["id"], "done")
    assert len(trials) == 2 and trials[1]["state"] == "done"
    study = load_study(folder)
    assert [t.state.name for t in study.trials[:2]] == ["FAIL", "COMPLETE"]
    assert study.trials[1].params == trial["params"]


def test_an_optuna_rerun_retries_its_failed_trials_with_their_own_settings(
    tmp_path, monkeypatch, capsys
):
    """A grid's rerun retries its failed trials; an Optuna rerun used to say "2 of 2 trials
    recorded" and run nothing, exit 1, however the fault was fixed."""
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    calls = fake_trials(monkeypatch, tmp_path, {"*": "fail"})
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 1
    folder = tmp_path / "o"
    failed = records(folder)
    assert [t["state"] for t in failed] == ["failed", "failed"]
    capsys.readouterr()

    fake_trials(monkeypatch, tmp_path, {})  # the fault fixed
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 0
    ids = ", ".join(t["id"] for t in failed)
    assert f"retrying 2 failed trial(s) with their own settings: {ids}" in capsys.readouterr().out
    trials = records(folder)
    assert [(t["id"], t["state"]) for t in trials] == [(t["id"], "done") for t in failed]
    ran = [(c["run"], c["lr"]) for c in calls_of(calls)]
    assert ran == [(t["id"], float(t["settings"]["train.lr"])) for t in failed] * 2
    study = load_study(folder)  # their old Optuna trials failed; their settings asked again
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    assert [t.params for t in study.trials[2:]] == [t["params"] for t in failed]
    assert "retries the failed trials" in " ".join(sweep_cli._parser().format_help().split())


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> Path:
    """The output folder of a finished 1-trial study "o" (its trial a stand-in)."""
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    out = tmp_path_factory.mktemp("study")
    with pytest.MonkeyPatch.context() as m:
        fake_trials(m, out, {})
        assert sweep_cli.main(ROOT, optuna_args(out, 1, *UNPRUNED)) == 0
    return out


def copy_of(finished_study: Path, tmp_path: Path) -> Path:
    """The finished study in tmp_path/o, as if it had run there."""
    folder = shutil.copytree(finished_study / "o", tmp_path / "o")
    manifest = folder / "sweep.json"
    manifest.write_text(manifest.read_text().replace(str(finished_study), str(tmp_path)))
    return folder


def other_study(path: Path, name: str, lr: str) -> None:
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{path}")
    dists = {"train.lr": optuna.distributions.CategoricalDistribution(["0.05", "1e-9"])}
    trial = optuna.trial.create_trial(params={"train.lr": lr}, distributions=dists, value=0)
    study.add_trial(trial)


def damage_study(path: Path, how: str, record: dict):
    """Damage study.db; returns a sqlite3 connection that holds it locked, for "locked"."""
    data = path.read_bytes()
    if how == "garbage":
        path.write_bytes(b"not a database at all " * 100)
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "a folder":
        path.unlink()
        path.mkdir()
    elif how == "another program's":
        path.unlink()
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE notes (text)")
    elif how in ("another sweep's", "other trials"):
        path.unlink()  # "o" again, its trial of the other lr: not what sweep.json records
        ran = record["params"]["train.lr"]
        other_study(path, "x" if how == "another sweep's" else "o", ran if how != "other trials"
                    else next(v for v in ("0.05", "1e-9") if v != ran))  # fmt: skip
    elif how == "another optuna's schema":
        with sqlite3.connect(path) as con:
            con.execute("UPDATE alembic_version SET version_num = 'v99.0.0'")
    elif how == "locked":
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        return holder
    return None


def files_in(folder: Path) -> dict:
    return {p: p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


@pytest.mark.parametrize(
    "how, fix",
    [
        ("garbage", "remove it"),
        ("truncated", "remove it"),
        ("a folder", "remove it"),
        ("another program's", "remove it"),
        ("another sweep's", "remove it"),
        ("other trials", "remove it"),
        ("another optuna's schema", "another version of optuna"),
        ("locked", "wait for that process to finish"),
    ],
)
def test_a_study_db_that_cannot_be_used_is_one_line_and_nothing_is_written(
    finished_study, tmp_path, monkeypatch, capsys, how, fix
):
    fake_trials(monkeypatch, tmp_path, {})  # were a trial to start
    folder = copy_of(finished_study, tmp_path)
    monkeypatch.setattr(sweep_manifest, "LOCK_WAIT_S", 0.05, raising=False)
    holder = damage_study(folder / "study.db", how, records(folder)[0])
    before = files_in(folder)
    capsys.readouterr()
    try:
        assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 2
    finally:
        if holder is not None:
            holder.close()
    line = one_error_line(capsys.readouterr().err)
    assert "study.db" in line and fix in line, line
    assert files_in(folder) == before


def test_a_removed_study_db_is_rebuilt_from_the_records(finished_study, tmp_path, monkeypatch):
    fake_trials(monkeypatch, tmp_path, {})
    folder = copy_of(finished_study, tmp_path)
    [done] = records(folder)
    (folder / "study.db").unlink()  # what the one-line refusals advise
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 0
    study = load_study(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    first = study.trials[0]  # told again, its curve too: sampling and pruning learn from it
    assert first.params == done["params"] and first.user_attrs["sweep_trial"] == done["id"]
    assert sorted(first.intermediate_values) == [1000, 2000]
    assert [t["number"] for t in records(folder)] == [0, 1]


def test_an_optuna_sweep_refuses_to_continue_after_its_config_file_changed(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    fake_trials(monkeypatch, tmp_path, {})
    with monkeypatch.context() as m:  # the study starts and runs no trial: sweep.json is all
        m.setattr(sweep_optuna, "_run", lambda *args: 0)
        config = tmp_path / "exp.yaml"
        config.write_text("train:\n  grad_clip: 0.5\n")
        args = [*optuna_args(tmp_path, 2), "--config", str(config)]
        assert sweep_cli.main(ROOT, args) == 0
    config.write_text("train:\n  grad_clip: 0.25\n")
    before = files_in(tmp_path / "o")
    capsys.readouterr()
    assert sweep_cli.main(ROOT, args) == 2
    assert "--config file" in one_error_line(capsys.readouterr().err)
    assert files_in(tmp_path / "o") == before


@pytest.mark.usefixtures("stop_signals_raise")
def test_a_stop_while_an_optuna_sweep_starts_ends_it_before_its_first_trial(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    calls = fake_trials(monkeypatch, tmp_path, {})
    stop_inside(monkeypatch, sweep_manifest, "hold_sweep", signal.SIGTERM)
    assert sweep_cli.main(ROOT, optuna_args(tmp_path, 2, *UNPRUNED)) == 75
    out, err = capsys.readouterr()
    assert not calls_of(calls) and "Traceback" not in err
    assert "sweep stopped (SIGTERM)" in out and out.endswith(f"({tmp_path / 'o'})\n")


def test_every_validation_is_reported_at_its_share_of_an_epoch(tmp_path):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    metrics = tmp_path / "metrics.csv"  # train.max_steps=20: the run ends inside epoch 2
    metrics.write_text("epoch,step,val/acc\n1,16,0.5\n1.25,20,0.625\n")
    study = optuna.create_study(direction="maximize")
    sweep_optuna._report(study.ask(), metrics, "acc", {})
    assert study.trials[0].intermediate_values == {1000: 0.5, 1250: 0.625}


def test_no_trial_is_pruned_within_the_warmup_a_quarter_of_its_epochs_by_default(tmp_path):
    """The median pruner used to stop trials on their first epoch's noise."""
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    warmup = sweep_optuna.prune_warmup(None, trial_epochs=8)  # 2 epochs
    assert sweep_optuna.prune_warmup(1.5, trial_epochs=8) == 1501
    assert sweep_optuna.prune_warmup(None, trial_epochs=2) == 1001  # at least one epoch
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=warmup)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text("epoch,step,val/acc\n1,8,0.9\n2,16,0.9\n3,24,0.9\n")
    first = study.ask()
    assert not sweep_optuna._report(first, good, "acc", {})
    study.tell(first, 0.9)
    second, reported = study.ask(), {}
    bad.write_text("epoch,step,val/acc\n1,8,0.1\n2,16,0.1\n")
    assert not sweep_optuna._report(second, bad, "acc", reported)  # within the warm-up
    bad.write_text("epoch,step,val/acc\n1,8,0.1\n2,16,0.1\n3,24,0.1\n")
    assert sweep_optuna._report(second, bad, "acc", reported)  # after it: pruned


def test_pruning_compares_trials_at_the_same_share_of_an_epoch_whatever_their_batch(tmp_path):
    optuna = pytest.importorskip("optuna", reason=f"the sweep extra: {INSTALL}")
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    (tmp_path / "a.csv").write_text("epoch,step,val/acc\n1,16,0.9\n")  # batch 16: 16 steps
    first = study.ask()
    assert not sweep_optuna._report(first, tmp_path / "a.csv", "acc", {})
    study.tell(first, 0.9)
    (tmp_path / "b.csv").write_text("epoch,step,val/acc\n1,8,0.2\n")  # batch 32: 8 steps
    assert sweep_optuna._report(study.ask(), tmp_path / "b.csv", "acc", {})  # worse: pruned


@pytest.mark.parametrize(
    "error, fix",
    [
        ("disk I/O error", "no room to write it"),  # sqlite's word for ENOSPC and EFBIG
        ("database or disk is full", "no room to write it"),
        ("database is locked", "another process holds it"),
        ("file is not a database", "remove it"),
    ],
)
def test_a_study_error_names_the_fix_that_matches_its_cause(error, fix):
    """A file-size limit hit while study.db is written is sqlite's 'disk I/O error': its line
    says to free space, not to remove the study (which would lose the trials it holds)."""
    from {{ cookiecutter.package_name }}.tools.sweep_study import study_errors

    path = Path("sweeps/s/study.db")
    with pytest.raises(ConfigError, match=fix), study_errors(path):
        raise RuntimeError("sqlalchemy") from sqlite3.OperationalError(error)
