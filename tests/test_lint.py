"""The template's own code (hooks and their answer checks, tests, benchmarks) is held to the
same lint as a bake."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import TEMPLATE


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_template_code_is_ruff_clean(command):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "hooks", "tests", "benchmarks"]
        + ["cookiecutter_pytorch_checks.py"],
        cwd=TEMPLATE,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
