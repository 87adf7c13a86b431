"""The end of a run: early stopping (also across a resume) and the summary, whose paths
exist and whose commands run."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from conftest import run_script, stop_after

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import Progress
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.summary import summary
from {{ cookiecutter.package_name }}.trainer import fit

STEPS_PER_EPOCH = 256 // 16  # the tiny fixture's train_size // batch_size
# No epoch can beat the best acc by more than 1: every epoch after the first is a bad one, so
# patience 2 stops after epoch 3 whatever the model learns.
EARLY = ["train.epochs=8", "train.early_stop_patience=2", "train.early_stop_min_delta=1"]


def last_of(tiny: list[str], run: str = "default") -> Path:
    return Path(load_config(None, tiny).run.output_dir) / run / "last.pt"


@pytest.mark.slow
def test_early_stopping_stops_after_patience_epochs_without_improvement(tiny):
    result = fit(load_config(None, [*tiny, *EARLY]))
    assert result["stopped"] == "early_stopping"
    assert (result["epoch"], result["step"]) == (3, 3 * STEPS_PER_EPOCH)
    progress = checkpoint.load(last_of(tiny))["progress"]
    assert progress["bad_epochs"] == 2 and progress["best_epoch"] in (1, 2, 3)


@pytest.mark.slow
def test_min_delta_zero_counts_only_epochs_that_do_not_improve(tiny):
    # A learning rate this small changes no prediction of an MLP (no BatchNorm statistics
    # either): acc never improves after epoch 1.
    frozen = ["model.name=mlp", "train.lr=1e-12", "train.epochs=6", "train.early_stop_patience=1"]
    result = fit(load_config(None, [*tiny, *frozen]))
    assert result["stopped"] == "early_stopping" and result["epoch"] == 2


@pytest.mark.slow
def test_a_stopped_and_resumed_run_stops_early_at_the_same_epoch(tiny, monkeypatch):
    straight = fit(load_config(None, [*tiny, *EARLY, "run.name=straight"]))
    # Stop mid-epoch 3: epoch 2 was already a bad epoch, which the resume must remember.
    mid = 2 * STEPS_PER_EPOCH + 3
    stopping = stop_after(monkeypatch, mid)
    first = fit(load_config(None, [*tiny, *EARLY, *stopping, "run.name=split"]))
    assert first["stopped"] == "SIGTERM" and first["step"] == mid
    second = fit(load_config(None, [*tiny, *EARLY, "run.name=split", "train.resume=auto"]))
    assert second["stopped"] == "early_stopping"
    assert (second["epoch"], second["step"]) == (straight["epoch"], straight["step"])


def test_early_stopping_settings_are_validated(tiny):
    with pytest.raises(ConfigError, match="train.early_stop_patience must be >= 0"):
        load_config(None, [*tiny, "train.early_stop_patience=-1"])
    with pytest.raises(ConfigError, match="train.early_stop_min_delta must be a finite"):
        load_config(None, [*tiny, "train.early_stop_min_delta=-0.1"])


@pytest.mark.slow
def test_a_checkpoint_without_the_new_progress_fields_resumes(tiny, tmp_path):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    state = checkpoint.load(last_of(tiny))
    for key in ("best_epoch", "bad_epochs", "train_seconds", "samples", "metrics"):
        del state["progress"][key]  # as saved before these fields existed
    old = tmp_path / "old.pt"
    torch.save(state, old)
    result = fit(load_config(None, [*tiny, "train.epochs=2", f"train.resume={old}"]))
    assert result["epoch"] == 2 and result["stopped"] is None


def summary_of(text: str) -> tuple[list[str], dict[str, str]]:
    """(the run folder's files, {name: command}) read from a printed summary."""
    lines = text.splitlines()
    folder = next(line for line in lines if line.strip().startswith("run folder "))
    where, _, names = folder.strip().removeprefix("run folder ").partition(": ")
    start = lines.index("next:")
    commands = dict(line.strip().split(": ", 1) for line in lines[start + 1 :] if ": " in line)
    return [str(Path(where) / name) for name in names.split(", ")], commands


@pytest.mark.slow
def test_summary_names_existing_files_and_commands_that_run(tiny, capsys):
    fit(load_config(None, [*tiny, "train.epochs=2"]))
    out = capsys.readouterr().out
    assert "run default finished: epoch 2, step 32" in out
    assert "best val acc (max)" in out and "final val: loss" in out and "samples/s" in out
    files, commands = summary_of(out)
    assert all(Path(f).exists() for f in files) and any(f.endswith("best.pt") for f in files)
    assert set(commands) == {"evaluate", "predict", "export", "compare"}  # feature: export
    assert set(commands) == {"evaluate", "predict", "compare"}  # feature: !export
    for name in ("evaluate", "predict"):
        argv = shlex.split(commands[name])
        assert argv[0] == "python"
        proc = run_script(*argv[1:])
        assert proc.returncode == 0, f"{commands[name]}\n{proc.stderr}"
    predictions = shlex.split(commands["predict"])[-1]
    assert len(Path(predictions).read_text().splitlines()) == 1 + 96  # header + val samples


def test_the_summary_shows_the_scalars_and_says_where_the_per_class_figures_are(tmp_path):
    cfg = load_config(None, [f"run.output_dir={tmp_path}"])
    per_class = {f"{m}/class_{i}": 0.5 for m in ("precision", "recall", "f1") for i in range(40)}
    progress = Progress(epoch=1, step=9, best=0.9, metrics={"loss": 0.25, "acc": 0.9} | per_class)
    test = ({"loss": 0.5, "acc": 0.75} | per_class, "best.pt")
    lines = summary(cfg, progress, "finished", {}, 1.0, test).splitlines()
    where = "(+120 per class/label: metrics.csv, evaluate.py's report)"
    assert f"  final val: loss 0.2500 | acc 0.9000 {where}" in lines
    assert lines[3].endswith(f"loss 0.5000 | acc 0.7500 {where}")  # the test split's
    assert len(lines) < 20 and not any("class_1" in line for line in lines)  # one screen


@pytest.mark.slow
def test_resuming_a_complete_run_prints_its_summary_again(tiny, capsys):
    fit(load_config(None, [*tiny, *EARLY]))
    first = capsys.readouterr().out
    again = fit(load_config(None, [*tiny, *EARLY, "train.resume=auto"]))
    out = capsys.readouterr().out
    assert again["stopped"] == "early_stopping" and "is complete" in out
    stopped_early = "run default stopped early: val acc did not improve by more than 1 for 2"
    assert stopped_early in first and stopped_early in out
    best = next(line for line in first.splitlines() if "best val acc" in line)
    assert best in out


# >>> fsdp
def test_an_fsdp_run_s_next_commands_consolidate_first(tmp_path):
    """Sharded checkpoints are read by the scripts once consolidated: the summary says so."""
    from {{ cookiecutter.package_name }}.summary import next_commands

    cfg = load_config(None, [f"run.output_dir={tmp_path}", "train.strategy=fsdp"])
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "best.pt").touch()
    commands = next_commands(cfg, {})
    assert list(commands)[0] == "consolidate" and "best.pt" in commands["consolidate"]
    for name in ("evaluate", "predict", "export"):  # feature: export
    for name in ("evaluate", "predict"):  # feature: !export
        assert str(tmp_path / "default" / "best.full.pt") in commands[name], commands[name]
# <<< fsdp
