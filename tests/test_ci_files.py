"""The baked project's CI workflow, pre-commit config and `make format`, checked offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, **kwargs)


def test_make_format_formats_despite_an_unfixable_lint_error(bake):
    project = bake()
    bad = project / "scripts" / "messy.py"
    bad.write_text("import os\n\n\ndef f( a,b ):\n    return undefined_name+a\n")
    proc = run(["make", "format", f"PYTHON={sys.executable}"], cwd=project)
    assert proc.returncode != 0  # the lint error is reported, and make says so
    assert "F821" in proc.stdout and "undefined_name" in proc.stdout, proc.stdout
    # ...after fixing (unused import gone) and formatting.
    assert bad.read_text() == "def f(a, b):\n    return undefined_name + a\n"
    check = run([sys.executable, "-m", "ruff", "format", "--check", "."], cwd=project)
    assert check.returncode == 0, check.stdout
