"""Every run records what made it (run.json, utils/provenance.py) and scripts/reproduce.py
re-creates it: each difference with now is one line, code or data or software that differ
are refused, and a rerun here gives bitwise the same losses and weights."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_script, tiny_run

from {{ cookiecutter.package_name }}.config import load_config, save_config, to_dict
from {{ cookiecutter.package_name }}.tools import compare, reproduce
from {{ cookiecutter.package_name }}.tools.reproduce import reproduce_main
from {{ cookiecutter.package_name }}.utils import provenance


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A git checkout with one commit, as the working folder; the code state read afresh."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    git(work, "config", "user.email", "t@example.com")
    git(work, "config", "user.name", "t")
    (work / "model.py").write_text("width = 8\n")
    (work / "notes.bin").write_bytes(bytes(range(256)))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "first")
    monkeypatch.chdir(work)
    provenance.code_state.cache_clear()
    yield work
    provenance.code_state.cache_clear()


def table_run(folder: Path, rows: int = 40) -> tuple[object, Path]:
    """A config naming a CSV table in `folder`, and the table."""
    table = folder / "table.csv"
    lines = ["a,b,label"] + [f"{i},{i % 3},{i % 2}" for i in range(rows)]
    table.write_text("\n".join(lines) + "\n")
    out = folder / "runs"
    out.mkdir()  # training makes it before the record: the hashes' cache lives there
    cfg = load_config(
        None, ["data.name=csv", f"data.path={table}", "model.name=mlp", f"run.output_dir={out}"]
    )
    return cfg, table


def run_folder(cfg, name: str = "default") -> Path:
    """A run folder as training starts it: config.yaml and run.json."""
    run = Path(cfg.run.output_dir) / name
    run.mkdir(parents=True)
    save_config(cfg, run / "config.yaml")
    record, diff = provenance.collect(cfg, to_dict(cfg), 1)
    provenance.write(run, record, diff)
    return run


def test_the_record_names_code_software_machine_and_each_data_file(repo):
    cfg, table = table_run(repo)
    record = json.loads((run_folder(cfg) / "run.json").read_text())
    assert record["code"]["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert record["code"]["dirty"] is False
    assert "table.csv" in record["code"]["untracked"]  # listed, never copied
    assert record["software"]["packages"]["torch"] and record["software"]["python"]
    assert record["machine"]["cpus"] and record["launch"]["world_size"] == 1
    [entry] = record["data"]
    import hashlib

    assert entry["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert entry["size"] == table.stat().st_size


def test_the_diff_patch_applied_to_the_commit_gives_the_tree_that_ran(repo, tmp_path):
    (repo / "model.py").write_text("width = 16\n")  # edited, not committed
    (repo / "notes.bin").write_bytes(bytes(range(255, -1, -1)))
    cfg, _ = table_run(repo)
    run = run_folder(cfg)
    record = json.loads((run / "run.json").read_text())
    assert record["code"]["dirty"] is True and (run / "diff.patch").is_file()
    # The recorded commit in a clean copy, then the patch: the files that ran.
    copy = tmp_path / "copy"
    git(repo, "worktree", "add", "-q", "--detach", str(copy), record["code"]["commit"])
    assert (copy / "model.py").read_text() == "width = 8\n"
    git(copy, "apply", str(run / "diff.patch"))
    assert (copy / "model.py").read_text() == "width = 16\n"
    assert (copy / "notes.bin").read_bytes() == (repo / "notes.bin").read_bytes()


def test_data_is_hashed_once_per_file_version(repo, monkeypatch):
    cfg, table = table_run(repo)
    first = provenance.data_files(cfg)
    monkeypatch.setattr(provenance, "_sha256_file", lambda path: pytest.fail("hashed again"))
    assert provenance.data_files(cfg) == first  # the cache answered
    table.write_text(table.read_text() + "99,0,1\n")  # a new size: hashed again
    with pytest.raises(pytest.fail.Exception, match="hashed again"):
        provenance.data_files(cfg)


def test_a_folder_is_one_digest_of_its_listing_or_of_its_bytes(repo):
    images = repo / "images" / "cat"
    images.mkdir(parents=True)
    (images / "a.png").write_bytes(b"x" * 10)
    cache: dict = {}
    listing = provenance.digest(repo / "images", cache)
    content = provenance.digest(repo / "images", cache, content=True)
    assert listing["files"] == 1 and "listing" in listing and "content" in content
    (images / "a.png").write_bytes(b"y" * 10)  # same size; a new mtime or new bytes
    import os

    os.utime(images / "a.png", ns=(1, 1))
    assert provenance.digest(repo / "images", cache)["listing"] != listing["listing"]
    assert provenance.digest(repo / "images", cache, True)["content"] != content["content"]


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ("data", "data: {table} has changed"),
        ("dirty", "code: uncommitted changes none then, yes"),
        ("package", "software: numpy 0.0.1 then,"),
        ("missing", "data: {table} is missing now"),
    ],
)
def test_each_difference_is_one_line_and_the_rerun_is_refused(repo, capsys, change, line):
    cfg, table = table_run(repo)
    run = run_folder(cfg)
    if change == "data":
        table.write_text(table.read_text().replace("0,0,0", "0,0,1"))
    elif change == "dirty":
        (repo / "model.py").write_text("width = 9\n")
        provenance.code_state.cache_clear()
    elif change == "package":  # faked through the record
        record = json.loads((run / "run.json").read_text())
        record["software"]["packages"]["numpy"] = "0.0.1"
        (run / "run.json").write_text(json.dumps(record))
    else:
        table.unlink()
    assert reproduce_main(ROOT / "scripts", [str(run), "--check"]) == 1
    out, _ = capsys.readouterr()
    assert [row for row in out.splitlines() if row.startswith(line.format(table=table))], out
    assert reproduce_main(ROOT / "scripts", [str(run)]) == 2  # refused: nothing trained
    assert "pass --anyway" in capsys.readouterr().err
    assert sorted(p.name for p in run.parent.iterdir()) == [".hashes.json", "default"]


def test_a_resume_keeps_the_first_record_and_lists_what_changed(repo, capsys):
    cfg, _ = table_run(repo)
    run = run_folder(cfg)
    first = json.loads((run / "run.json").read_text())
    (repo / "model.py").write_text("width = 12\n")  # the resume runs other code
    provenance.code_state.cache_clear()
    record, diff = provenance.collect(cfg, to_dict(cfg), 1)
    provenance.write(run, record, diff)
    kept = json.loads((run / "run.json").read_text())
    assert kept["code"] == first["code"] and not (run / "diff.patch").exists()
    [resume] = kept["resumes"]
    assert resume["changes"] == ["code: uncommitted changes none then, " + _dirty_now(record)]
    assert reproduce_main(ROOT / "scripts", [str(run), "--check"]) == 1
    assert "at its resume of " in capsys.readouterr().out


def _dirty_now(record: dict) -> str:
    return f"yes ({record['code']['diff_sha256'][:12]}) now"


def test_the_same_checkout_and_data_pass_the_check(repo, capsys):
    cfg, _ = table_run(repo)
    run = run_folder(cfg)
    assert reproduce_main(ROOT / "scripts", [str(run), "--check"]) == 0
    assert "same code, software, machine and data" in capsys.readouterr().out


def test_a_run_without_a_record_gets_one_line(tmp_path, capsys):
    cfg = load_config(None, [f"run.output_dir={tmp_path}"])
    (tmp_path / "default").mkdir()
    save_config(cfg, tmp_path / "default" / "config.yaml")
    assert reproduce_main(ROOT / "scripts", [str(tmp_path / "default"), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "run.json" in err and "train it again" in err


def test_evaluate_and_predict_name_code_or_data_that_changed(repo):
    cfg, table = table_run(repo)
    record, _ = provenance.collect(cfg, to_dict(cfg), 1)
    assert reproduce.drift(record, cfg.run.output_dir) is None
    table.write_text(table.read_text() + "7,7,1\n")
    line = reproduce.drift(record, cfg.run.output_dir)
    assert line.startswith("note: trained on other code or data") and "table.csv" in line
    record["code"]["commit"] = "0" * 40
    assert "commit 0000000000000000000000000000000000000000 then" in reproduce.drift(
        record, cfg.run.output_dir
    )


def test_compare_runs_shows_record_differences_beside_settings(repo, capsys):
    cfg, _ = table_run(repo)
    first = run_folder(cfg, "a")
    second = run_folder(cfg, "b")
    record = json.loads((second / "run.json").read_text())
    record["software"]["torch"] = "9.9.9"
    (second / "run.json").write_text(json.dumps(record))
    for run in (first, second):
        (run / "metrics.csv").write_text("epoch,step,val/loss\n1,1,0.5\n")
    assert compare.compare_main([str(first), str(second), "--out", str(repo / "c.png")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "software.torch" in header and "code.commit" not in header  # only what differs


@pytest.mark.slow
def test_a_run_reproduced_gives_bitwise_equal_losses_and_weights(tiny, tmp_path):
    done = run_script("scripts/train.py", *tiny, "run.threads=0")
    assert done.returncode == 0, done.stderr
    run = tiny_run(tiny)
    redone = run_script("scripts/reproduce.py", str(run), timeout=240)
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert "equal to the original's; final weights bitwise equal" in redone.stdout
    again = run.parent / "default-repro"
    assert (again / "run.json").is_file() and (run / "run.json").is_file()
    # A changed loss is caught: the comparison can fail.
    rows = (again / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    cells = rows[-1].split(",")
    cells[header.index("val/loss")] = "0.123456"
    (again / "metrics.csv").write_text("\n".join([*rows[:-1], ",".join(cells)]) + "\n")
    assert reproduce._compare_runs(run, again, same_setup=True) == 1
    shutil.rmtree(again)
