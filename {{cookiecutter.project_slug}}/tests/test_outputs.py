"""Where the tools write (tools/outputs.py): never over a run's checkpoints and records nor
over their own inputs, over another existing file only with --force; what a killed tool left
beside its target is removed by the next start; a damaged record set aside never replaces an
earlier one."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import TINY

from {{ cookiecutter.package_name }}.checkpoint import run_folder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import UserError
from {{ cookiecutter.package_name }}.tools import outputs
from {{ cookiecutter.package_name }}.tools.compare import compare_main
from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main  # feature: fsdp
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import run_files
from {{ cookiecutter.package_name }}.utils.logger import record_run


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def snapshot(root: Path) -> dict[str, bytes]:
    files = (p for p in root.rglob("*") if p.is_file() and p.name != ".lock")
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def refused(code: int, capsys, fragment: str) -> None:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


# ---- the rule, on paths alone ------------------------------------------------------------


def test_every_file_a_run_leaves_is_a_run_file(tmp_path):
    """The one place that knows a run folder's files knows all that training writes."""
    out = tmp_path / "runs"
    overrides = [*TINY, "train.epochs=1", "data.train_size=64", "data.val_size=32"]
    overrides += ["run.loggers=[csv,tensorboard]", f"run.output_dir={out}"]
    fit(load_config(None, overrides))
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"best.pt", "last.pt", "config.yaml", "metrics.csv", "runs.csv"} <= {
        p.name for p in files
    }
    assert any(p.parent.name == "tb" for p in files)
    assert [p for p in files if outputs.run_file(p) is None] == []
    run = out / "default"
    for name in ("metrics.csv.damaged.2", "step-00000004.pt.bad", ".lock"):
        assert outputs.run_file(run / name), name
    assert outputs.run_file(run / "step-00000016.dcp" / "__0_0.distcp")  # feature: fsdp
    assert outputs.run_file(run) == "a run or output folder"
    # What the tools write beside a run is not a run's file.
    for name in ("predictions.csv", "best.ts.pt", "best_report", "best.full.pt"):
        assert outputs.run_file(run / name) is None, name
    assert outputs.run_file(out / "compare.png") is None


def test_the_step_files_outputs_refuses_are_the_ones_training_names():
    # utils/run_files.py holds the names, and RunFolder saves and finds by them.
    assert run_folder.STEP_FILE.pattern == run_files.STEP_FILE.pattern
    assert run_files.STEP_FILE.fullmatch(run_files.step_file(12))
    assert outputs.run_file(Path("deploy") / "step-00000012.pt") is None  # no run's folder


def test_common_names_outside_a_run_area_are_not_run_files_and_lock_names_are(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.yaml", "metrics.csv", "curves.png"):
        assert outputs.run_file(plain / name) is None, name
    for name in (".lock", ".runs.lock", "runs.csv.damaged"):
        assert outputs.run_file(plain / name), name  # their names say what they are


def test_a_checkpoint_name_outside_a_run_is_refused_only_for_a_training_checkpoint(tmp_path):
    """deploy/best.pt: a new file of that name, or one that holds weights only, is no run's
    (anyone may name a file best.pt); a checkpoint that training saved is, wherever it was
    copied."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("best.pt", "last.pt", "step-00000002.pt", "step-00000002.pt.bad"):
        assert outputs.run_file(deploy / name) is None, name
        assert outputs.check_out(deploy / name) == deploy / name
    torch.save({"model": {}, "progress": {}, "meta": {}}, deploy / "best.pt")
    assert outputs.run_file(deploy / "best.pt") is None  # replaced as its own, or with --force
    torch.save({"model": {}, "optimizer": {}, "progress": {}}, deploy / "last.pt")
    with pytest.raises(UserError, match=re.escape("is a checkpoint of a run (last.pt)")):
        outputs.check_out(deploy / "last.pt", force=True)
    (deploy / "link.pt").symlink_to(deploy / "last.pt")
    with pytest.raises(UserError, match="is a checkpoint of a run"):
        outputs.check_out(deploy / "link.pt", force=True)  # what it links to counts
    # Inside a run folder every checkpoint name is the run's, there or not.
    (deploy / "config.yaml").write_text("run: {}\n")
    assert (
        outputs.run_file(deploy / "step-00000004.pt") == "a checkpoint of a run (step-00000004.pt)"
    )


def test_check_out_refuses_run_files_inputs_and_other_files(tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("a,b\n1,2\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    (tmp_path / "link.csv").symlink_to(table)
    os.link(table, tmp_path / "hard.csv")
    (tmp_path / "to_config.csv").symlink_to(run / "config.yaml")
    torch.save({"model": {}, "optimizer": {}}, tmp_path / "best.pt")  # a copied checkpoint
    cases = {
        run / "metrics.csv": "a record of the run folder",
        tmp_path / "best.pt": "a checkpoint of a run (best.pt)",
        tmp_path / "to_config.csv": "a record of the run folder",  # what it links to counts
        table: "is one of this command's inputs",
        tmp_path / "link.csv": "is one of this command's inputs",
        tmp_path / "hard.csv": "is one of this command's inputs",
        run: "a run or output folder",
        tmp_path: "is a folder",
    }
    for path, fragment in cases.items():
        for force in (False, True):  # --force changes none of these
            with pytest.raises(UserError, match=re.escape(fragment)):
                outputs.check_out(path, [table], force=force)
    other = tmp_path / "other.csv"
    other.write_text("mine\n")
    with pytest.raises(UserError, match="exists and is not an earlier output.*--force"):
        outputs.check_out(other, [table])
    assert outputs.check_out(other, [table], force=True) == other
    assert outputs.check_out(other, [table], own=lambda p: p == other) == other
    assert outputs.check_out(tmp_path / "new.csv", [table]) == tmp_path / "new.csv"
    assert other.read_text() == "mine\n" and table.read_text() == "a,b\n1,2\n"


def test_remove_stale_takes_only_a_dead_process_temporaries_of_its_target(tmp_path):
    target = tmp_path / "model.pt"
    dead, alive = dead_pid(), os.getppid()
    stale_dir = tmp_path / f".model.pt.tmp{dead}"
    stale_dir.mkdir()
    (stale_dir / "model.pt").write_bytes(b"half")
    stale_file = tmp_path / f".model.pt.tmp{dead}.old"
    stale_file.write_bytes(b"x")
    live = tmp_path / f".model.pt.tmp{alive}"
    live.mkdir()
    other = tmp_path / f".other.pt.tmp{dead}"
    other.write_bytes(b"not this target's")
    assert sorted(outputs.remove_stale(target)) == sorted([stale_dir, stale_file])
    assert live.is_dir() and other.is_file()


def test_a_damaged_record_set_aside_twice_keeps_both(tmp_path):
    table = tmp_path / "runs.csv"
    for n, damage in enumerate([b"run,steps\n\xff\xfe,1\n", b"run,steps\n\xfa,2\n"]):
        table.write_bytes(damage)
        record_run(tmp_path, {"run": f"r{n}", "steps": n})
    assert (tmp_path / "runs.csv.damaged").read_bytes() == b"run,steps\n\xff\xfe,1\n"
    assert (tmp_path / "runs.csv.damaged.2").read_bytes() == b"run,steps\n\xfa,2\n"


# ---- each tool, on a trained run ----------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny run of two epochs (its files: step files, best.pt, last.pt, the records)."""
    out = tmp_path_factory.mktemp("outputs")
    fit(load_config(None, [*TINY, f"run.output_dir={out}"]))
    return out / "default"


@pytest.fixture
def kept(run):
    """The run folder's files, byte for byte: checked unchanged after each test."""
    before = snapshot(run.parent)
    yield
    after = snapshot(run.parent)
    assert {k: v for k, v in after.items() if k in before} == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "fragment"),
    [("best.pt", "a checkpoint of a run"), ("metrics.csv", "a record of the run folder")],
)
def test_no_tool_writes_over_a_run_file(run, kept, capsys, name, fragment):
    best, target = str(run / "best.pt"), str(run / name)
    code = predict_main(["--checkpoint", best, "--split", "val", "--out", target])
    refused(code, capsys, fragment)
    args = ["--checkpoint", best, "--format", "torchscript", "--out", target, "--force"]  # feature: export
    refused(export_main(args), capsys, fragment)  # feature: export
    refused(compare_main([str(run), "--out", target, "--force"]), capsys, fragment)
    refused(consolidate_main(["--checkpoint", best, "--out", target]), capsys, fragment)  # feature: fsdp
    refused(evaluate_main(["--checkpoint", best, "--report", str(run)]), capsys, "a run or")
    assert consolidate_main(["--checkpoint", best, "--out", str(run / "last.pt")]) == 2  # feature: fsdp


@pytest.mark.slow
def test_predict_never_replaces_its_input_and_asks_before_another(run, kept, tmp_path, capsys):
    best = str(run / "best.pt")
    inputs = tmp_path / "x.pt"
    torch.save({"x": torch.randn(5, 3, 8, 8)}, inputs)
    (tmp_path / "link.csv").symlink_to(inputs)
    for out in (inputs, tmp_path / "link.csv"):
        code = predict_main(["--checkpoint", best, str(inputs), "--out", str(out), "--force"])
        refused(code, capsys, "is one of this command's inputs")
    other = tmp_path / "notes.csv"
    other.write_text("my notes\n")
    code = predict_main(["--checkpoint", best, str(inputs), "--out", str(other)])
    refused(code, capsys, "exists and is not an earlier output of this tool")
    assert other.read_text() == "my notes\n"
    assert predict_main(["--checkpoint", best, str(inputs), "--out", str(other), "--force"]) == 0
    # Its own earlier CSV is replaced without --force: the same command runs twice.
    assert predict_main(["--checkpoint", best, "--split", "val", "--out", str(other)]) == 0
    assert len(other.read_text().splitlines()) == 1 + 96


@pytest.mark.slow
def test_a_tool_replaces_its_own_output_and_asks_before_another(run, kept, tmp_path, capsys):
    model = tmp_path / "model.pt"
    model.write_bytes(b"someone else's file")
    # >>> export
    best = str(run / "best.pt")
    args = ["--checkpoint", best, "--format", "torchscript", "--out", str(model)]
    refused(export_main(args), capsys, "exists and is not an earlier output of this tool")
    assert model.read_bytes() == b"someone else's file"
    assert export_main([*args, "--force"]) == 0
    assert export_main(args) == 0  # its own export, with its JSON: replaced once checked
    model.write_bytes(b"someone else's file")
    # <<< export
    plot = tmp_path / "plot.png"
    assert compare_main([str(run), "--out", str(plot)]) == 0
    assert compare_main([str(run), "--out", str(plot)]) == 0  # its own plot
    refused(compare_main([str(run), "--out", str(model)]), capsys, "exists and is not")


@pytest.mark.slow
def test_evaluate_replaces_an_earlier_report_and_refuses_another_folder(
    run, kept, tmp_path, capsys
):
    best = str(run / "best.pt")
    report = tmp_path / "report"
    assert evaluate_main(["--checkpoint", best, "--report", str(report)]) == 0
    assert evaluate_main(["--checkpoint", best, "--report", str(report)]) == 0
    assert (report / "report.json").is_file()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    refused(evaluate_main(["--checkpoint", best, "--report", str(mine)]), capsys, "holds other")
    assert (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_a_start_removes_what_a_killed_tool_left_beside_its_target(run, kept, tmp_path):
    """kill -9 mid-write leaves .<name>.tmp<pid>: a staging folder (the report, say) or a
    temporary file (predict); the next start removes the dead process's, no other."""
    best, dead, alive = str(run / "best.pt"), dead_pid(), os.getppid()
    leftovers = [
        tmp_path / f".model.pt.tmp{dead}",  # feature: export
        tmp_path / f".preds.csv.tmp{dead}",
        tmp_path / f".report.tmp{dead}",
    ]
    for path in leftovers:
        path.mkdir() if "csv" not in path.name else path.write_text("half a table")
    live = tmp_path / f".model.pt.tmp{alive}"  # feature: export
    live = tmp_path / f".report.tmp{alive}"  # feature: !export
    live.mkdir()
    args = ["--checkpoint", best, "--format", "torchscript", "--out", str(tmp_path / "model.pt")]  # feature: export
    assert export_main(args) == 0  # feature: export
    out = str(tmp_path / "preds.csv")
    assert predict_main(["--checkpoint", best, "--split", "val", "--out", out]) == 0
    assert evaluate_main(["--checkpoint", best, "--report", str(tmp_path / "report")]) == 0
    assert [p for p in leftovers if p.exists()] == [] and live.is_dir()
