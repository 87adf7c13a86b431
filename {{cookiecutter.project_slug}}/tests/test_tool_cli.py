"""What every script's command line shares (tools/cli.py): an argument error is one bounded
`error:` line, and a tool stopped by a signal ends with one line and exit 75 (130 for
Ctrl-C), nothing written, instead of a traceback or a kill."""

from __future__ import annotations

import importlib
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path  # feature: fsdp

import pytest
import torch  # feature: fsdp
from conftest import ROOT, TINY

from {{ cookiecutter.package_name }} import checkpoint  # feature: fsdp
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools import cli, export
from {{ cookiecutter.package_name }}.tools.compare import compare_main
from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main  # feature: fsdp
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.tools.train import smoke_main, train_main
from {{ cookiecutter.package_name }}.trainer import fit

MB = "9" * 2**20


def tool(name: str):
    """tools/<name>.py, imported when a case runs (a tool left out of the project is none)."""
    return importlib.import_module(f"{{ cookiecutter.package_name }}.tools.{name}")


def script_main(name: str):
    return runpy.run_path(str(ROOT / "scripts" / name), run_name="as_module")["main"]


BAD_ARGUMENTS = {
    "train": (train_main, [f"--nope={MB}"]),
    "smoke": (lambda argv: smoke_main(ROOT, argv), [f"--nope={MB}"]),
    "evaluate": (evaluate_main, ["--checkpoint", "x.pt", "--json", f"--nope={MB}"]),
    "predict": (predict_main, ["--checkpoint", "x.pt", "--batch-size", MB]),
    "export": (export_main, ["--checkpoint", "x.pt", "--format", MB]),
    "compare": (compare_main, ["runs", "--x", MB]),
    "consolidate": (consolidate_main, [f"--checkpoint={MB}", "--bogus"]),  # feature: fsdp
    "make_demo_data": (lambda argv: script_main("make_demo_data.py")(argv), [f"--nope={MB}"]),
    "benchmark_dataloader": (
        lambda argv: script_main("benchmark_dataloader.py")(argv),
        ["--batches", MB],
    ),
    # >>> sweeps
    "sweep": (lambda argv: tool("sweep_cli").main(ROOT, argv), ["--name", "s", "--parallel", MB]),
    # <<< sweeps
    "doctor": (lambda argv: script_main("doctor.py")(argv), [f"--nope={MB}"]),
    # >>> gpu_check
    "benchmark_gpu": (lambda argv: script_main("benchmark_gpu.py")(argv), ["--steps", MB]),
    "gpu_check": (lambda argv: script_main("gpu_check.py")(argv), ["--only", MB]),
    # <<< gpu_check
}


@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_an_argument_error_is_one_bounded_line(name, capsys):
    main, argv = BAD_ARGUMENTS[name]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[:300]
    assert len(err.encode()) < 1024 and "--help" in lines[0], lines[0][:300]


@pytest.fixture
def handlers():
    """The process's signal handlers as they were: a stop signal that the code under test
    fails to catch is ignored here (it would end the test run) and shows as a wrong exit."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda *_: None)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    cli._held.clear()


def signalled(sig=signal.SIGTERM):
    os.kill(os.getpid(), sig)
    return 0


def test_a_stop_during_a_tool_is_one_line_and_exit_75(handlers, capsys):
    assert cli.guard(signalled, False, stoppable=True) == 75
    assert capsys.readouterr().err == (
        "stopped by SIGTERM; nothing was written: run the command again\n"
    )
    assert cli.guard(lambda: signalled(signal.SIGINT), False, stoppable=True) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_stop_held_during_start_up_ends_the_tool_before_it_runs(handlers, capsys):
    cli._held.append(signal.SIGTERM)  # what hold_signals() notes while torch imports
    ran = []
    assert cli.guard(lambda: ran.append(1), False, stoppable=True) == 75
    assert ran == [] and "stopped by SIGTERM" in capsys.readouterr().err


def test_a_stop_while_the_output_is_put_in_place_waits_for_it(handlers):
    def run():
        cli.placing_output()
        signalled()
        return 0  # reached: the output is whole, and the exit code says so

    assert cli.guard(run, False, stoppable=True) == 0


# >>> fsdp
@pytest.mark.slow
def test_a_stop_right_after_consolidate_puts_its_file_in_place_ends_it_as_written(
    handlers, tmp_path, monkeypatch, capsys
):
    """The stop lands just after the rename that put the new file in place: it is whole, so
    the tool ends as it would have (exit 0), not with "nothing was written". Its --out,
    deploy/best.pt, is a new file outside any run: no run's checkpoint."""
    import torch.distributed.checkpoint as dcp

    fit(load_config(None, [*TINY, f"run.output_dir={tmp_path}", "train.max_steps=1"]))
    state = checkpoint.load(tmp_path / "default" / "last.pt")
    run = tmp_path / "sharded"  # a run whose checkpoint is sharded: step-N.pt and its shards
    with pytest.warns(UserWarning, match="torch.distributed is "):  # no group: meant here
        dcp.save({"model": state.pop("model")}, checkpoint_id=run / "step-00000001.dcp")
    del state["optimizer"]
    torch.save({**state, "shards": "step-00000001.dcp"}, run / "step-00000001.pt")
    out = tmp_path / "deploy" / "best.pt"
    out.parent.mkdir()
    replace = os.replace

    def replaced_then_stopped(source, target):
        replace(source, target)
        if Path(target) == out:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "replace", replaced_then_stopped)
    code = consolidate_main(["--checkpoint", str(run / "step-00000001.pt"), "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0 and f"wrote {out}" in stdout and stderr == "", stderr
    assert checkpoint.load(out)["meta"]["consolidated_from"] == str(run / "step-00000001.pt")
# <<< fsdp


@pytest.mark.slow
def test_a_stop_during_export_leaves_the_previous_artifact(handlers, tmp_path, monkeypatch):
    fit(load_config(None, [*TINY, "train.epochs=1", f"run.output_dir={tmp_path}"]))
    best, out = str(tmp_path / "default" / "best.pt"), tmp_path / "model.pt"
    args = ["--checkpoint", best, "--format", "torchscript", "--out", str(out)]
    assert export_main(args) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    real = export.run_artifact

    def signalled_during_the_check(*a):  # the new artifact is staged, not yet in place
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a)

    monkeypatch.setattr(export, "run_artifact", signalled_during_the_check)
    assert export_main(args) == 75
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


# Sends SIGTERM when the module argv[1] is first imported (torch: the slowest part of a
# tool's start), then runs the script argv[2] as `python scripts/<name>.py` would.
SIGNAL_AT_IMPORT = """
import os, runpy, signal, sys

class SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)

MODULE = sys.argv[1]
sys.meta_path.insert(0, SignalAtImport())
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def signalled_at_import(module: str, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SIGNAL_AT_IMPORT, module, str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", ["export.py", "evaluate.py", "predict.py"])
def test_a_signal_while_the_script_imports_is_one_line_and_exit_75(tmp_path, script):
    """The scripts hold stop signals from before their imports: one that comes then ends the
    tool as soon as it can act, with one line and nothing written."""
    args = ["--checkpoint", str(tmp_path / "best.pt")]
    args += {"export.py": ["--format", "export"], "predict.py": ["--split", "val"]}.get(script, [])
    proc = signalled_at_import("torch", script, *args)
    assert proc.returncode == 75, proc.stderr
    assert proc.stderr == "stopped by SIGTERM; nothing was written: run the command again\n"
    assert list(tmp_path.iterdir()) == []


def test_every_scripts_help_describes_it_in_whole_sentences():
    """--help's description is the docstring's first paragraph, whole: the first line of it
    once ended benchmark_dataloader.py's help mid-sentence ("... num_workers values,")."""
    import ast

    for path in sorted((ROOT / "scripts").glob("*.py")):
        text = path.read_text()
        assert "__doc__.splitlines()[0]" not in text, path.name
        doc = ast.get_docstring(ast.parse(text))
        if doc and "description=__doc__" in text:
            first = doc.split("\n\n")[0].replace("\n", " ").strip()
            assert first.endswith((".", ")")), f"{path.name}: {first[-60:]!r}"
