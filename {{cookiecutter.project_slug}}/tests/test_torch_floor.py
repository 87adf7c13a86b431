"""The oldest torch the project supports (pyproject's floor, 2.6): every file that names it
says the same. What needs a newer torch is refused below its version with one line and
nothing written (tested where it is, with the torch_2_6 fixture of conftest.py). CI's floor
job runs the fast tests on the floor itself."""

from __future__ import annotations

import re

from conftest import ROOT, documentation


def floor() -> str:
    # A regex, not tomllib: it reads only the one line it needs.
    text = (ROOT / "pyproject.toml").read_text()
    (found,) = re.findall(r'^dependencies = \["torch>=(\d+\.\d+)"', text, re.M)
    return found


def test_every_file_that_names_the_floor_says_the_same():
    assert floor() == "2.6"
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    assert [line for line in requirements if line.startswith("torch")] == [f"torch>={floor()}"]
    named = re.findall(r"torch>=([\d.]+)", documentation())
    assert named and set(named) == {floor()}
