"""The baked project on the oldest torch it allows (its pyproject's floor): a venv with that
torch from the registry runs the baked essentials (train and bitwise resume, resume with a
changed layout, checkpoint safety, export, the floor's own refusals of what needs a newer torch).

Slow, and kept cheap: uv installs the floor torch (PyPI's build for Linux is a CUDA one, about
3 GB with its libraries; it runs on the CPU) in about 75 s the first time and about 2 s once
its cache holds it; the selection takes about 1 min on 2 loaded cores. Nothing else of the
machine's environment is used: the package runs from the bake through PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# What the floor venv needs for the selection: the core dependencies and pytest (no extras:
# ONNX export is refused below torch 2.7, and its tests are left out).
PACKAGES = ["numpy", "pyyaml", "tqdm", "tensorboard", "pytest", "pillow"]
SELECTION = [
    "tests/test_torch_floor.py",
    "tests/test_checkpoint_safety.py",
    "tests/test_resume_layout.py",
    "tests/test_collectives.py",
    "tests/test_train.py::test_resume_is_bitwise_exact",
    "tests/test_export.py::test_each_format_loads_back_and_matches_the_model",
    "tests/test_export_lengths.py",
]


def torch_floor(project: Path) -> str:
    dependencies = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    (line,) = [d for d in dependencies["dependencies"] if re.match(r"torch\b", d)]
    return re.fullmatch(r"torch>=(\d+\.\d+)", line).group(1)


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


@pytest.mark.slow
def test_the_baked_essentials_pass_on_the_floor_torch(bake, tmp_path):
    project = bake()
    floor = torch_floor(project)
    venv = tmp_path / "floor-venv"
    uv = [sys.executable, "-m", "uv"]
    # uv ignores pip's settings (CI's PIP_CONSTRAINT pins the newest torch): this pin decides.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    try:
        made = run([*uv, "venv", "-q", "--python", sys.executable, venv], env=env, timeout=120)
        assert made.returncode == 0, made.stderr
        python = venv / "bin" / "python"
        install = [*uv, "pip", "install", "-q", "--python", python, f"torch=={floor}.*"]
        installed = run([*install, *PACKAGES], env=env, timeout=900)
        assert installed.returncode == 0, installed.stderr[-2000:]
        version = run([python, "-c", "import torch; print(torch.__version__)"], timeout=120)
        assert version.stdout.startswith(f"{floor}."), version.stdout + version.stderr
        tests = run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow"]
            + ["-k", "not onnx", *SELECTION],
            cwd=project,
            env={**env, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"},
            timeout=900,
        )
        tail = "\n".join(tests.stdout.splitlines()[-30:])
        assert tests.returncode == 0, tail + tests.stderr[-2000:]
        assert re.search(r"\d+ passed", tail) and " failed" not in tail, tail
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # links into uv's cache, but 5 GB of names
