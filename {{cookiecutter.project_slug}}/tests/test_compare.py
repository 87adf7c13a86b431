"""scripts/compare_runs.py: a table of runs with only the settings that differ, one overlay of
their validation curves, and one-line errors for what is not a run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_script

from {{ cookiecutter.package_name }}.config import load_config, save_config
from {{ cookiecutter.package_name }}.tools import compare
from {{ cookiecutter.package_name }}.tools.compare import compare_main
from {{ cookiecutter.package_name }}.utils.logger import record_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(out: Path, name: str, overrides: list[str], accs: list[float]) -> Path:
    """A run folder as training leaves it (config.yaml, metrics.csv, its runs.csv line),
    without the seconds of training: the table and plot read nothing else."""
    cfg = load_config(None, [f"run.name={name}", f"run.output_dir={out}", *overrides])
    run = out / name
    run.mkdir(parents=True)
    save_config(cfg, run / "config.yaml")
    rows = ["epoch,step,train/epoch_loss,val/loss,val/acc,lr,time/train_s,time/elapsed_s"]
    for epoch, acc in enumerate(accs, 1):
        rows.append(f"{epoch},{epoch * 10},1.0,{1 - acc},{acc},0.001,2.0,{epoch * 3.0}")
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    record_run(out, {"run": name, "epochs": len(accs), "best_val_acc": max(accs)})
    return run


@pytest.fixture
def three_runs(tmp_path) -> Path:
    out = tmp_path / "checkpoints"
    out.mkdir()
    fake_run(out, "base", [], [0.5, 0.6])
    fake_run(out, "fast", ["train.lr=0.01"], [0.4, 0.7, 0.8])
    fake_run(out, "wide", ["train.lr=0.01", "model.width=64", "run.seed=42"], [0.3])
    return out


def table_of(printed: str) -> list[list[str]]:
    lines = [line for line in printed.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_table_lists_exactly_the_settings_that_differ(three_runs, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert compare_main([str(three_runs / "*"), "--out", str(out)]) == 0  # runs.csv skipped
    head, _, *rows = table_of(capsys.readouterr().out)
    # run.name differs too, but names the rows; run.seed=42 is everyone's default
    assert head == ["run", "best val acc", "epochs", "steps", "wall time", "model.width",
                    "train.lr"]  # fmt: skip
    assert rows == [
        ["base", "0.6000", "2", "20", "6.0s", "32", "0.003"],
        ["fast", "0.8000", "3", "30", "9.0s", "32", "0.01"],
        ["wide", "0.3000", "1", "10", "3.0s", "64", "0.01"],
    ]


def test_overlay_draws_each_runs_validation_curves(three_runs, tmp_path):
    pytest.importorskip("matplotlib", reason="plots are optional: pip install -e '.[plots]'")
    runs = compare.find_runs([str(three_runs)])  # a folder of runs stands for its runs
    curves = {run.name: compare.summarise(run)["columns"] for run in runs}
    out = tmp_path / "overlay.png"
    assert compare.plot_overlay(curves, out) == 3 * 2  # 3 runs x (val/loss, val/acc)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_one_setting_changed_one_column(tmp_path, capsys):
    out = tmp_path / "checkpoints"
    a = fake_run(out, "a", ["data.split_seed=1"], [0.5])
    b = fake_run(out, "b", ["data.split_seed=2", "train.resume=auto"], [0.6])
    assert compare_main([str(a), str(b), "--out", str(tmp_path / "c.png")]) == 0
    head = table_of(capsys.readouterr().out)[0]
    assert head[5:] == ["data.split_seed"]  # train.resume says how a run started: not listed


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("missing", "does not exist"),
        ("empty", "is not a run folder (no config.yaml) and holds none"),
        ("nothing*", "matches nothing"),
    ],
)
def test_what_is_not_a_run_gets_one_line_and_exit_2(tmp_path, capsys, arg, message):
    (tmp_path / "empty").mkdir()
    assert compare_main([str(tmp_path / arg), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "c.png").exists()


@pytest.mark.slow
def test_script_writes_compare_png_beside_the_runs(three_runs, tmp_path):
    runs = [str(three_runs / "base"), str(three_runs / "fast")]
    script = str(ROOT / "scripts" / "compare_runs.py")
    proc = run_script(script, *runs, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "| base |" in proc.stdout and "| wide |" not in proc.stdout
    pytest.importorskip("matplotlib", reason="plots are optional: pip install -e '.[plots]'")
    assert (three_runs / "compare.png").read_bytes()[:8] == PNG_MAGIC  # not in the cwd


def test_without_matplotlib_the_table_still_prints(three_runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a missing package looks like
    out = tmp_path / "c.png"
    assert compare_main([str(three_runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert len(table_of(printed)) == 2 + 3 and not out.exists()
    assert "no plot without matplotlib; to draw it: pip install -e '.[plots]'" in printed


@pytest.mark.parametrize(
    ("file", "damage", "why"),
    [
        ("config.yaml", b"train: [unclosed\n", "not valid YAML"),
        ("config.yaml", b"\xff\xfe\x00train", "not UTF-8"),
        ("config.yaml", b"train:\n  lrr: 1\n", "unknown config key"),
        ("metrics.csv", b"epoch,val/acc\n1,\xff\xfe\n", "not UTF-8"),
    ],
)
def test_an_unreadable_run_is_skipped_with_a_line(three_runs, tmp_path, capsys, file, damage, why):
    (three_runs / "fast" / file).write_bytes(damage)
    assert compare_main([str(three_runs), "--out", str(tmp_path / "c.png")]) == 0
    out, err = capsys.readouterr()
    assert [row[0] for row in table_of(out)[2:]] == ["base", "wide"]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skipped ") and why in lines[0], lines
    assert str(three_runs / "fast" / file) in lines[0]
