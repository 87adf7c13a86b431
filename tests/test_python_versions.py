"""Each Python version the template offers, run for real where this machine has it: a project
baked for it compiles under that interpreter with warnings as errors (an invalid escape is a
SyntaxWarning from 3.12, an error later), and its standard-library scripts run there. torch
publishes wheels for each offered version, but this machine's CPU wheel is for 3.11 only, so
the project's own suite runs on 3.11 (test_bake.py's slow layer)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TEMPLATE

OFFERED = json.loads((TEMPLATE / "cookiecutter.json").read_text())["python_version"]
# Compile every file of the project (not the environment, not a cache) with this interpreter.
COMPILE_ALL = """
import pathlib, sys, warnings
warnings.simplefilter("error")
bad = []
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.py")):
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except (SyntaxError, SyntaxWarning) as exc:
        bad.append(f"{path}: {exc}")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def interpreter_version(python: str) -> str | None:
    probe = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def interpreter(version: str) -> str | None:
    """A working `python<version>`: on PATH, or in pyenv's versions folder (its shim may
    refuse a version that is not the global one)."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(map(str, Path.home().glob(f".pyenv/versions/{version}.*/bin/python3")))
    return next((c for c in filter(None, candidates) if interpreter_version(c) == version), None)


def test_the_offered_versions_are_the_supported_ones():
    """3.10 reached its end of life in October 2026; torch publishes wheels for 3.11-3.13."""
    assert OFFERED == ["3.11", "3.12", "3.13"]


@pytest.mark.parametrize("version", OFFERED)
def test_a_project_for_each_offered_version_compiles_and_its_scripts_run_there(bake, version):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    project = bake(python_version=version)
    compiled = subprocess.run(
        [python, "-c", COMPILE_ALL, str(project)], capture_output=True, text=True, timeout=120
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    # The standard-library scripts, as `make env` runs them (before any environment exists).
    dry = subprocess.run(
        [python, "scripts/create_env.py", "--dry-run", "--manager", "venv", "--compute", "cpu"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    venv = shlex.split(dry.stdout.splitlines()[0])  # the venv of that version, found here
    assert venv[1:] == ["-m", "venv", ".venv"]
    assert interpreter_version(venv[0]) == version
