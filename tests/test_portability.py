"""What runs on the user's machine before the project's own environment exists.

The hooks and scripts/create_env.py run on the Python that cookiecutter runs on, from 3.9 (an
older one is refused in one line); the Makefile works where only `python3` is on PATH; the
build backend floor matches the pyproject it builds. The runs on other Pythons use the
interpreters this machine has (python3.X on PATH, or pyenv's) and are skipped without them.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from _hookutil import CREATE_ENV, clean_environ, render_hook_file

FLOOR = (3, 9)


def find_python(version: str) -> str | None:
    """An interpreter of exactly `version` (X.Y), or None."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    pyenv = sorted(str(p) for p in root.glob(f"versions/{version}.*/bin/python{version}"))
    for exe in filter(None, [shutil.which(f"python{version}"), *pyenv]):
        try:
            found = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if found.returncode == 0 and found.stdout.strip() == version:
            return exe
    return None


def python_or_skip(version: str) -> str:
    exe = find_python(version)
    if exe is None:
        pytest.skip(f"no Python {version} on this machine")
    return exe


def run(cmd: list, cwd: Path, **variables: str) -> subprocess.CompletedProcess:
    env = clean_environ(**variables)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


# --- hooks and create_env.py on the user's Python ---


@pytest.mark.parametrize("name", ["pre_gen_project", "post_gen_project", "create_env"])
def test_parses_as_python_39(tmp_path, name):
    path = CREATE_ENV if name == "create_env" else render_hook_file(name, tmp_path)
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=FLOOR)


def test_pre_hook_runs_on_python_39(tmp_path):
    python = python_or_skip("3.9")
    good = run([python, render_hook_file("pre_gen_project", tmp_path)], tmp_path)
    assert (good.returncode, good.stdout, good.stderr) == (0, "", "")
    # 3.9 has no sys.stdlib_module_names: the hook lists the standard library itself.
    for name in ("json", "asyncio", "math"):
        hook = render_hook_file("pre_gen_project", tmp_path, package_name=name)
        bad = run([python, hook], tmp_path)
        assert bad.returncode == 1
        assert f"shadow the standard library module '{name}'" in bad.stderr


def test_post_hook_and_create_env_run_on_python_39(bake, tmp_path):
    python = python_or_skip("3.9")
    answers = {"license": "none", "init_git": "yes", "env_manager": "none"}
    project = bake(license="none")  # no git yet: the hook makes the first commit
    (project / "LICENSE").write_text("put back, for the hook to remove\n")
    hook = render_hook_file("post_gen_project", tmp_path, **answers, run_smoke_test="no")
    identity = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.org"}
    identity |= {"GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.org"}
    result = run([python, hook], project, **identity)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "git init + first commit ... done" in result.stdout
    assert "environment: none requested" in result.stdout  # create_env.py ran, on 3.9
    assert "cookiecutter-pytorch: ready" in result.stdout
    assert not (project / "LICENSE").exists()
    for manager in ("venv", "uv", "conda"):
        cmd = [python, "scripts/create_env.py", "--dry-run", "--manager", manager]
        dry = run([*cmd, "--compute", "cpu"], project)
        assert dry.returncode == 0, dry.stderr
        assert "pip install" in dry.stdout


@pytest.mark.parametrize("version", ["3.8", "3.7"])
def test_pre_hook_refuses_older_python_in_one_line(tmp_path, version):
    python = python_or_skip(version)
    result = run([python, render_hook_file("pre_gen_project", tmp_path)], tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"cookiecutter-pytorch: cookiecutter runs on Python {version}.")
    assert "needs 3.9 or newer" in line


# --- Makefile: `python`, else `python3` ---


@pytest.fixture
def make():
    found = shutil.which("make")
    if found is None:
        pytest.skip("make is not installed")
    return found


def path_with(tmp_path: Path, *names: str) -> str:
    """A PATH of one folder holding links to `names` (and to grep and awk, for `make help`)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    python3 = shutil.which("python3")
    for name in names:
        target = python3 if name.startswith("python") else shutil.which(name)
        assert target, name
        (folder / name).symlink_to(target)
    return str(folder)


def make_dry_run(make: str, project: Path, path: str, target: str) -> str:
    env = {**os.environ, "PATH": path}
    env.pop("PYTHON", None)
    result = subprocess.run(
        [make, "-n", target], cwd=project, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_makefile_falls_back_to_python3(bake, make, tmp_path):
    project = bake()
    path = path_with(tmp_path, "python3", "grep", "awk")
    assert make_dry_run(make, project, path, "smoke").strip() == "python3 scripts/smoke.py"
    assert make_dry_run(make, project, path, "env").strip() == "python3 scripts/create_env.py"
    help_ = subprocess.run(
        [make, "help"], cwd=project, env={**os.environ, "PATH": path}, capture_output=True
    )
    assert help_.returncode == 0 and b"make smoke" in help_.stdout


def test_makefile_prefers_python_then_the_venv(bake, make, tmp_path):
    project = bake()
    path = path_with(tmp_path, "python", "python3")
    assert make_dry_run(make, project, path, "smoke").strip() == "python scripts/smoke.py"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").touch()
    assert make_dry_run(make, project, path, "smoke").startswith(".venv/bin/python scripts/")
    assert make_dry_run(make, project, path, "env").startswith("python scripts/create_env.py")


# --- build backend floor ---


@pytest.mark.parametrize("license_", ["MIT", "Apache-2.0", "none"])
def test_setuptools_floor_reads_the_spdx_license(bake, license_):
    pyproject = tomllib.loads((bake(license=license_) / "pyproject.toml").read_text())
    assert pyproject["project"].get("license") == (None if license_ == "none" else license_)
    (requirement,) = pyproject["build-system"]["requires"]
    floor = re.fullmatch(r"setuptools>=(\d+)", requirement)
    assert floor and int(floor.group(1)) >= 77  # the first with `license = "<SPDX>"`
