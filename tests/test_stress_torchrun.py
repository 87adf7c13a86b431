"""The torchrun stress script (benchmarks/stress_torchrun.py) in its smallest form: it bakes
the template, launches the 2-rank CPU run twice and reports no failure (slow: ~20 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stress_torchrun.py"


@pytest.mark.slow
def test_two_launches_without_load_pass(tmp_path):
    out = tmp_path / "stress.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--launches", "2", "--load", "0", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 launches, 0 failures" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["rc"] for r in results] == [0, 0]
