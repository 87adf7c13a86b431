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

import pytest
from conftest import ROOT

from {{ cookiecutter.package_name }}.tools import cli
from {{ cookiecutter.package_name }}.tools.compare import compare_main
from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main  # feature: fsdp
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.tools.train import smoke_main, train_main

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
    "export": (export_main, ["--checkpoint", "x.pt", "--format", MB]),  # feature: export
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
@pytest.mark.parametrize("script", ["export.py", "evaluate.py", "predict.py"])  # feature: export
@pytest.mark.parametrize("script", ["evaluate.py", "predict.py"])  # feature: !export
def test_a_signal_while_the_script_imports_is_one_line_and_exit_75(tmp_path, script):
    """The scripts hold stop signals from before their imports: one that comes then ends the
    tool as soon as it can act, with one line and nothing written."""
    args = ["--checkpoint", str(tmp_path / "best.pt")]
    args += ["--split", "val"] if script == "predict.py" else []
    args += ["--format", "export"] if script == "export.py" else []  # feature: export
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
