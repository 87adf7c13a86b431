"""One line instead of a traceback when a script runs before `pip install -e .`: each script
imports the package inside `try`, and a ModuleNotFoundError for the package lands here."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "{{ cookiecutter.package_name }}"


def not_installed(exc: ModuleNotFoundError) -> None:
    """Exit 2 with the command to run when `exc` is about the package itself; re-raise any
    other missing module (a dependency such as torch names itself)."""
    if exc.name != PACKAGE:
        raise exc
    root = Path(__file__).resolve().parents[1]
    sys.stderr.write(f"error: the package is not installed: run pip install -e . (from {root})\n")
    raise SystemExit(2)
