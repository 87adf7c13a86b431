"""What a new user's first hour tripped on: a warm-up longer than the run, ties for best.pt, a
busy machine, an extended run at its floor lr, the tools' files and printouts, and scripts run
before `pip install -e .`."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torch
import yaml  # feature: images
from conftest import ROOT, documentation, run_script  # feature: images
from conftest import ROOT, run_script  # feature: !images

from {{ cookiecutter.package_name }} import checkpoint, loop
from {{ cookiecutter.package_name }}.checkpoint import Progress
from {{ cookiecutter.package_name }}.config import load_config, save_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.optim import build_optimizer, build_scheduler, continue_schedule
from {{ cookiecutter.package_name }}.tools import compare
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import device as devices
from {{ cookiecutter.package_name }}.utils import logger
from {{ cookiecutter.package_name }}.utils.logger import human_count

PACKAGE = "{{ cookiecutter.package_name }}"


def run_dir(tiny: list[str], name: str = "default") -> Path:
    return Path(load_config(None, tiny).run.output_dir) / name


# --- the warm-up: a count or a fraction of the run, its plan in the run line ---


def plan_of(warmup: str, total: int):
    cfg = load_config(None, [f"train.warmup_steps={warmup}"]).train
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg, 1.0, fused=False)
    return build_scheduler(optimizer, cfg, total).lr_lambdas[0]


@pytest.mark.parametrize(
    ("warmup", "total", "steps"), [("0.25", 40, 10), ("0.05", 20, 1), ("5", 40, 5)]
)
def test_warmup_steps_is_a_count_or_a_fraction_of_the_planned_steps(warmup, total, steps):
    assert plan_of(warmup, total).warmup == steps


def test_the_default_warmup_is_a_fraction_that_fits_a_small_run():
    default = load_config(None).train.warmup_steps
    assert plan_of(str(default), 20).warmup == 1  # 50 steps before: the lr climbed all run


@pytest.mark.parametrize("bad", ["-1", "-0.1", "1.5", "nan", "inf"])
def test_a_negative_or_fractional_count_of_warmup_steps_is_refused(bad):
    rule = "train.warmup_steps must be a step count .* or a fraction"
    with pytest.raises(ConfigError, match=rule):
        load_config(None, [f"train.warmup_steps={bad}"])


def test_the_first_run_line_shows_the_plan_and_warns_of_a_warmup_longer_than_the_run(
    tiny, capsys, monkeypatch
):
    monkeypatch.setattr(devices.os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # a busy machine
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # run.threads=2 stays here
    fit(load_config(None, [*tiny, "train.epochs=1", "train.warmup_steps=50", "run.threads=2"]))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("run default:"))
    assert " 4.4k params |" in line  # not "0.00M"
    assert "| warm-up 15 of 16 steps" in line
    assert "CPU threads 2 (machine busy: load 9.0 on 2 CPUs; run.threads=1 is faster then)" in line
    assert (
        "warning: train.warmup_steps=50 is longer than the 16 steps this run plans: the lr "
        "climbs all run" in out
    )


def test_the_summary_lists_curves_png_drawn_at_the_end_of_the_run(tiny, capsys, monkeypatch):
    monkeypatch.setattr(logger, "available", lambda: True)  # matplotlib or not, here
    monkeypatch.setattr(logger, "plot_curves", lambda csv, png: png.write_bytes(b"png") and 1)
    monkeypatch.setattr(logger, "DRAW_AT_END_AFTER_S", 0)  # as a run of 30 s or more
    fit(load_config(None, [*tiny, "train.epochs=1"]))  # shorter than REDRAW_EVERY_S
    out = capsys.readouterr().out
    folder = next(x for x in out.splitlines() if x.startswith("  run folder "))
    files = "best.pt, config.yaml, curves.png, last.pt, metrics.csv, run.json, step-00000016.pt"
    assert folder.endswith(f": {files}")


def test_an_idle_machine_or_one_thread_gets_no_note(monkeypatch):
    monkeypatch.setattr(devices.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 2)
    assert devices.busy_note(1) == ""
    monkeypatch.setattr(devices.os, "getloadavg", lambda: (1.5, 9.0, 9.0))
    assert devices.busy_note(2) == ""


@pytest.mark.parametrize(
    ("count", "text"),
    [(999, "999"), (1603, "1.6k"), (2_300_000, "2.3M"), (999_950, "1.0M"), (12 * 10**8, "1.2B")],
)
def test_parameter_counts_read_as_people_write_them(count, text):
    assert human_count(count) == text


# --- extending a finished run: its lr stays at the floor, and it says so ---


def resumed_schedule(saved_total: int, step: int, new_total: int) -> str | None:
    cfg = load_config(None, ["train.warmup_steps=2", "train.min_lr_ratio=0.1"]).train
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg, 1.0, fused=False)
    scheduler = build_scheduler(optimizer, cfg, saved_total)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    return continue_schedule(optimizer, scheduler, cfg, 1.0, new_total)


def test_extending_a_finished_run_says_its_lr_stays_at_the_floor():
    note = resumed_schedule(10, 10, 20)
    assert note.startswith("note: the lr schedule of this run ended at step 10; its 10 more steps")
    assert "floor lr 1.00e-01" in note and "train.init_from=" in note
    assert resumed_schedule(10, 5, 20) is None  # mid-run: the cosine is stretched, no floor
    assert resumed_schedule(10, 10, 10) is None  # nothing to extend


# --- ties for best.pt: the lower loss wins, and resume keeps the tie-break value ---


def test_equal_accuracy_keeps_the_model_with_the_lower_loss():
    progress = Progress()
    assert progress.improves(0.9, "max", tie=(0.555, "min"))
    progress.epoch = 1
    assert progress.improves(0.9, "max", tie=(0.059, "min"))  # the later, better model
    assert (progress.best, progress.best_tie, progress.best_epoch) == (0.9, 0.059, 1)
    assert not progress.improves(0.9, "max", tie=(0.3, "min"))
    assert progress.best_tie == 0.059


def test_a_checkpoint_saved_before_the_tie_break_still_resumes():
    old = {k: v for k, v in vars(Progress(best=0.9, best_epoch=1)).items() if k != "best_tie"}
    progress = Progress()
    for key, value in old.items():  # as checkpoint.restore_training_state does
        setattr(progress, key, value)
    assert progress.best_tie is None
    assert not progress.improves(0.9, "max", tie=(0.01, "min"))  # unknown: the old best stays
    assert progress.improves(0.95, "max", tie=(0.5, "min")) and progress.best_tie == 0.5


def test_best_pt_breaks_a_tie_on_the_loss(tiny, monkeypatch):
    scripted = iter([{"loss": 0.555, "acc": 0.9}, {"loss": 0.059, "acc": 0.9}])  # 2 epochs
    monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: next(scripted))
    fit(load_config(None, tiny))  # 16 steps an epoch
    best = checkpoint.load(run_dir(tiny) / "best.pt")["progress"]
    assert (best["step"], best["best"], best["best_epoch"]) == (32, 0.9, 2)
    assert best["best_tie"] == 0.059  # saved: a resume compares with it


# --- the tools: where compare.png goes, evaluate's printout ---


def fake_run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    save_config(load_config(None, [f"run.name={folder.name}"]), folder / "config.yaml")
    (folder / "metrics.csv").write_text("epoch,step,val/loss,val/acc\n1,10,0.5,0.8\n")
    return folder


def test_compare_png_goes_beside_the_runs_not_into_the_working_folder(
    tmp_path, monkeypatch, capsys
):
    runs = [fake_run(tmp_path / "checkpoints" / name) for name in ("a", "b")]
    drawn = []
    monkeypatch.setattr(compare, "plot_overlay", lambda curves, out, x: drawn.append(out) or 1)
    monkeypatch.chdir(tmp_path)
    assert compare.compare_main([str(run) for run in runs]) == 0
    plot = tmp_path / "checkpoints" / "compare.png"
    assert drawn == [plot] and f"validation curves: {plot}" in capsys.readouterr().out


def test_evaluate_prints_its_metrics_once(tiny, capsys):
    fit(load_config(None, [*tiny, "train.max_steps=2"]))
    last = str(run_dir(tiny) / "last.pt")
    capsys.readouterr()
    assert evaluate_main(["--checkpoint", last]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("report: ")]
    assert len(lines) == 1, lines  # the human line, not the same metrics again as JSON
    assert lines[0].startswith(f"checkpoint {last} | step 2 | loss ")
    assert lines[0].endswith(" | count 96")
    assert evaluate_main(["--checkpoint", last, "--json"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("report: ")]
    assert len(lines) == 1 and json.loads(lines[0])["count"] == 96


# >>> images
# --- documentation of data.augment's cost ---


def test_the_cost_of_augmentation_and_how_to_turn_it_off_are_documented():
    readme = documentation()
    assert "data.augment=false" in readme and "loader throughput" in readme
    experiment = yaml.safe_load((ROOT / "configs/experiments/image_folder.yaml").read_text())
    assert "augment" in experiment["data"]
    assert "data.augment=false" in (ROOT / "configs/experiments/image_folder.yaml").read_text()
# <<< images


# --- scripts run before `pip install -e .`: one line with the command, exit 2 ---

# Runs a script as `python scripts/X.py` does, in a Python where the package cannot be found
# (an editable install would find it from anywhere; this hides it whatever the install).
WITHOUT_PACKAGE = """
import runpy, sys
package, script = sys.argv[1:3]
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == package:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
sys.path[0] = script.rpartition("/")[0]
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


# Scripts that import the package from their own tree (the project's root put on sys.path):
# they run before the install too (the doctor is what to run when it fails).
FROM_THE_TREE = {"doctor.py"}
# >>> gpu_check
FROM_THE_TREE.add("gpu_check.py")
# <<< gpu_check


def package_scripts() -> list[str]:
    """The scripts that import the package (ast: imports inside strings are not), but for
    FROM_THE_TREE."""
    names = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        if path.name in FROM_THE_TREE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                names.append(path.name)
                break
    return names


def run_without_package(script: str):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path = str(ROOT / "scripts" / script)
    return run_script("-c", WITHOUT_PACKAGE, PACKAGE, path, env=env)


def test_every_script_that_imports_the_package_says_how_to_install_it():
    scripts = package_scripts()
    assert {"train.py", "evaluate.py", "compare_runs.py", "predict.py"} <= set(scripts)
    for name in scripts:  # the import sits in the try whose except hands over to _bootstrap
        tree = ast.parse((ROOT / "scripts" / name).read_text())
        guarded = [node for node in tree.body if isinstance(node, ast.Try)]
        assert guarded and "_bootstrap.not_installed" in ast.unparse(guarded[0].handlers[0]), name


def test_train_before_pip_install_says_the_command_to_run():
    proc = run_without_package("train.py")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: the package is not installed: run pip install -e . (from {ROOT})\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", package_scripts())
def test_each_script_before_pip_install_says_the_command_to_run(script):
    proc = run_without_package(script)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2,
        [f"error: the package is not installed: run pip install -e . (from {ROOT})"],
    )


def test_the_suite_notices_a_file_a_test_leaves_in_the_project(tmp_path):
    """conftest's session check: what `make test` adds to the project is named at its end
    (caches aside; data/ and checkpoints/ by their entries, however many files they hold)."""
    from conftest import project_files

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("")
    (tmp_path / "data" / "big").mkdir(parents=True)
    (tmp_path / "data" / "big" / "0001.png").write_text("")
    (tmp_path / ".ruff_cache").mkdir()
    before = project_files(tmp_path)
    assert before == {"pkg/a.py", "data/big"}
    (tmp_path / "t.yaml").write_text("train: {}\n")  # what a test once left in the root
    (tmp_path / "data" / "big" / "0002.png").write_text("")  # inside a dataset: not walked
    (tmp_path / "checkpoints" / "default").mkdir(parents=True)
    (tmp_path / ".ruff_cache" / "x").write_text("")
    assert project_files(tmp_path) - before == {"t.yaml", "checkpoints/default"}


def test_show_config_prints_every_setting_with_its_meaning_as_a_config_that_reads(
    tmp_path, capsys
):
    """train.py --show-config: the chosen data, model and task's own keys too (csv's targets
    and normalize were once named only inside an error), each with its comment; saved, the
    text is a --config file giving the same settings."""
    from {{ cookiecutter.package_name }}.config import load_config, to_dict
    from {{ cookiecutter.package_name }}.tools.train import train_main

    # >>> multilabel
    overrides = ["data.name=csv", "model.name=mlp", "task.name=multilabel", "train.lr=0.01",
                 f"run.output_dir={tmp_path / 'runs'}"]  # fmt: skip
    # <<< multilabel
    # >>> !multilabel
    overrides = ["data.name=csv", "model.name=mlp", "task.name=classification", "train.lr=0.01",
                 f"run.output_dir={tmp_path / 'runs'}"]  # fmt: skip
    # <<< !multilabel
    assert train_main(["--show-config", *overrides]) == 0
    text = capsys.readouterr().out
    for line in ("  targets: auto  # auto: what task.name needs",
                 "  normalize: true  # standardise features",
                 "  pos_weight: none  # Loss weight of each label's positives",  # feature: multilabel
                 "  class_weights: none  # Loss weight per class",  # feature: !multilabel
                 "  lr: 0.01  # peak learning rate", "  width: 64  # hidden units"):  # fmt: skip
        assert line in text, line
    (tmp_path / "shown.yaml").write_text(text)
    assert to_dict(load_config(str(tmp_path / "shown.yaml"), [])) == to_dict(
        load_config(None, overrides)
    )
    assert not (tmp_path / "runs").exists() and "steps/epoch" not in text  # nothing trained
