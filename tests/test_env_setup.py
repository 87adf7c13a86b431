"""Environment setup: the commands create_env.py builds, environment.yml, the missing-tool
message, the smoke test's fail-soft report, and (slow) real venv and uv environments.

conda, mamba and micromamba cannot run on the test machines (no channel is reachable): their
path is tested through the exact commands built, the parsed environment.yml and the
missing-tool behaviour.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _hookutil import CREATE_ENV, HOOK_VARIABLES, clean_environ, load_create_env, run_cli

COMPUTES = ["auto", "cpu", "cu126", "cu128", "cu130"]
CONDA_TOOLS = ["conda", "mamba", "micromamba"]
INDEX = "https://download.pytorch.org/whl/{}"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="this Python has no torch")


@pytest.fixture(autouse=True)
def _no_hook_variables(monkeypatch):
    for name in HOOK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def ce():
    return load_create_env()


def fake_tools(folder: Path, *names: str) -> Path:
    """Executables that do nothing, named like the tools, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = folder / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    return folder


# --- torch index ---


@pytest.mark.parametrize("compute", COMPUTES)
def test_torch_index_of_each_compute(ce, compute):
    expected = None if compute == "auto" else INDEX.format(compute)
    assert ce.torch_index(compute, {}) == expected


@pytest.mark.parametrize("compute", COMPUTES)
def test_torch_index_variable_overrides(ce, compute):
    assert ce.torch_index(compute, {ce.INDEX_ENV: ""}) is None
    assert ce.torch_index(compute, {ce.INDEX_ENV: "file:///w"}) == "file:///w"


# --- exact commands ---


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("tool", CONDA_TOOLS)
def test_conda_family_command(ce, tmp_path, tool, compute):
    commands = ce.plan(tool, compute, "3.12", project=tmp_path, environ={})
    prefix = str(tmp_path / ".conda-env")
    assert commands == [[tool, "env", "create", "-y", "-f", "environment.yml", "-p", prefix]]
    exe = f"/opt/{tool}/bin/{tool}"
    assert ce.plan(tool, compute, "3.12", tool=exe, project=tmp_path)[0][0] == exe


@pytest.mark.parametrize("compute", COMPUTES)
def test_uv_commands(ce, compute):
    index = [] if compute == "auto" else ["--extra-index-url", INDEX.format(compute)]
    install = ["uv", "pip", "install", "--python", ".venv/bin/python", *index]
    install += ["-r", "requirements.txt", "-e", ".[dev]"]
    assert ce.plan("uv", compute, "3.12", environ={}) == [
        ["uv", "venv", ".venv", "--python", "3.12"],
        install,
    ]
    assert ce.plan("uv", compute, "3.12", environ={}, exists=True) == [install]


@pytest.mark.parametrize("compute", COMPUTES)
def test_venv_commands(ce, compute):
    index = [] if compute == "auto" else ["--extra-index-url", INDEX.format(compute)]
    install = [".venv/bin/python", "-m", "pip", "install", *index]
    install += ["-r", "requirements.txt", "-e", ".[dev]"]
    assert ce.plan("venv", compute, "3.11", environ={}) == [
        ["python3.11", "-m", "venv", ".venv"],
        install,
    ]
    assert ce.plan("venv", compute, "3.11", tool="/usr/bin/python3", environ={})[0][0] == (
        "/usr/bin/python3"
    )
    assert ce.plan("venv", compute, "3.11", environ={}, exists=True) == [install]


@pytest.mark.parametrize("manager", ["uv", "venv"])
def test_index_variable_reaches_the_install(ce, manager):
    (install,) = ce.plan(manager, "cu128", "3.11", environ={ce.INDEX_ENV: ""}, exists=True)
    assert "--extra-index-url" not in install
    (install,) = ce.plan(manager, "auto", "3.11", environ={ce.INDEX_ENV: "file:///w"}, exists=True)
    assert install[install.index("--extra-index-url") + 1] == "file:///w"


def test_none_plans_nothing(ce):
    assert ce.plan("none", "cpu", "3.11") == []


def test_no_command_names_the_dead_pytorch_channel(ce, tmp_path):
    for manager in (*CONDA_TOOLS, "uv", "venv"):
        for compute in COMPUTES:
            for cmd in ce.plan(manager, compute, "3.11", project=tmp_path, environ={}):
                assert "pytorch" not in cmd and "-c" not in cmd


# --- finding the tools ---


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        (["micromamba", "mamba", "conda", "uv"], "micromamba"),
        (["mamba", "conda", "uv"], "mamba"),
        (["conda", "uv"], "conda"),
        (["uv"], "uv"),
        ([], "venv"),
    ],
)
def test_auto_picks_conda_family_then_uv_then_venv(ce, tmp_path, installed, expected):
    folder = fake_tools(tmp_path / "bin", *installed)
    manager, tool = ce.resolve_manager("auto", "3.11", {"PATH": str(folder)})
    assert manager == expected
    if expected != "venv":
        assert tool == str(folder / expected)


@pytest.mark.parametrize(
    ("variable", "name"), [("MAMBA_EXE", "micromamba"), ("CONDA_EXE", "conda")]
)
def test_tool_found_through_its_variable_when_not_on_path(ce, tmp_path, variable, name):
    exe = fake_tools(tmp_path / "opt", name) / name
    environ = {"PATH": str(tmp_path / "nothing"), variable: str(exe)}
    assert ce.resolve_manager("auto", "3.11", environ) == (name, str(exe))
    assert ce.resolve_manager(name, "3.11", environ) == (name, str(exe))


@pytest.mark.parametrize("manager", [*CONDA_TOOLS, "uv"])
def test_missing_tool_resolves_to_none(ce, tmp_path, manager):
    assert ce.resolve_manager(manager, "3.11", {"PATH": str(tmp_path)}) == (manager, None)


def test_venv_uses_this_python_when_the_version_is_missing(ce, tmp_path):
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert ce.resolve_manager("venv", current, {}) == ("venv", sys.executable)
    assert ce.resolve_manager("venv", "3.99", {"PATH": str(tmp_path)}) == ("venv", sys.executable)


# --- missing tool, through a bake ---


@pytest.mark.parametrize("tool", CONDA_TOOLS)
def test_missing_conda_tool_prints_the_command_and_goes_on(
    bake, monkeypatch, tmp_path, capfd, tool
):
    monkeypatch.setenv("PATH", str(tmp_path))  # no conda of any kind
    monkeypatch.delenv("MAMBA_EXE", raising=False)
    monkeypatch.delenv("CONDA_EXE", raising=False)
    project = bake(env_manager=tool, run_smoke_test="no")
    out = capfd.readouterr().out
    assert f"environment: {tool} not found" in out
    assert "make env" in out
    later = f"{tool} env create -y -f environment.yml -p {project / '.conda-env'}"
    assert later in out
    assert "setup had problems" in out
    assert project.is_dir()


# --- environment.yml ---


@pytest.mark.parametrize(
    ("compute", "python_version"),
    [("auto", "3.11"), ("cpu", "3.12"), ("cu126", "3.13"), ("cu128", "3.10"), ("cu130", "3.11")],
)
def test_environment_yml(bake, compute, python_version):
    project = bake(compute=compute, python_version=python_version)
    env = yaml.safe_load((project / "environment.yml").read_text(encoding="utf-8"))
    assert env["channels"] == ["conda-forge"]
    deps = env["dependencies"]
    assert f"python={python_version}" in deps
    assert "pip" in deps
    assert not any("pytorch" in str(dep) and "::" in str(dep) for dep in deps)
    (pip,) = [dep["pip"] for dep in deps if isinstance(dep, dict)]
    index = [] if compute == "auto" else [f"--extra-index-url {INDEX.format(compute)}"]
    assert pip == [*index, "-r requirements.txt", "-e .[dev]"]
    assert (project / "requirements.txt").is_file()
    assert "dev = [" in (project / "pyproject.toml").read_text(encoding="utf-8")


def test_create_env_is_baked_unchanged(bake):
    project = bake()
    assert (project / "scripts" / "create_env.py").read_bytes() == CREATE_ENV.read_bytes()


# --- the script's CLI ---


def run_script(project: Path, *args: str, **variables: str):
    return subprocess.run(
        [sys.executable, "scripts/create_env.py", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=clean_environ(**variables),
        timeout=120,
    )


def test_dry_run_prints_the_exact_commands(bake, monkeypatch):
    monkeypatch.setenv("COOKIECUTTER_PYTORCH_SKIP_SETUP", "1")
    project = bake(compute="cu128", env_manager="venv")
    result = run_script(project, "--dry-run")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].endswith(" -m venv .venv")
    assert lines[1] == (
        ".venv/bin/python -m pip install --extra-index-url https://download.pytorch.org/whl/cu128"
        " -r requirements.txt -e '.[dev]'"
    )
    override = run_script(
        project, "--dry-run", "--manager", "uv", COOKIECUTTER_PYTORCH_TORCH_INDEX=""
    )
    assert "--extra-index-url" not in override.stdout


def test_help(bake):
    result = run_script(bake(), "--help")
    assert result.returncode == 0
    assert "--manager" in result.stdout and "--smoke" in result.stdout


def test_smoke_arguments_are_shell_split(ce):
    environ = {ce.SMOKE_ARGS_ENV: "train.lr=-1 'run.name=a b'"}
    assert ce.smoke_command("py", environ) == [
        "py",
        "scripts/smoke.py",
        "train.lr=-1",
        "run.name=a b",
    ]
    assert ce.smoke_command("py", {}) == ["py", "scripts/smoke.py"]


# --- fail-soft ---


def test_failed_step_shows_the_log_tail_and_the_retry(ce, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ce, "PROJECT", tmp_path)
    failing = [sys.executable, "-c", "import sys; print('boom: no wheel'); sys.exit(3)"]
    monkeypatch.setattr(ce, "plan", lambda *args, **kwargs: [failing])
    log = tmp_path / "setup.log"
    assert ce.create("venv", sys.executable, "cpu", "3.11", log) is False
    out = capsys.readouterr().out
    assert "FAILED (exit 3" in out
    assert f"last lines of {log}" in out
    assert "| boom: no wheel" in out
    assert "retry: cd" in out and "python scripts/create_env.py" in out


@needs_torch
@pytest.mark.parametrize(
    "broken", ["train.lr=-1", pytest.param("train.epochs=oops", marks=pytest.mark.slow)]
)
def test_failed_smoke_test_keeps_the_project(tmp_path, broken):
    env = clean_environ(COOKIECUTTER_PYTORCH_SMOKE_ARGS=broken)
    answers = ("env_manager=none", "run_smoke_test=yes", "init_git=no")
    result = run_cli(tmp_path, *answers, env=env)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "my-pytorch-project"
    assert (project / "scripts" / "smoke.py").is_file()
    out = result.stdout
    assert f"scripts/smoke.py {broken} ... FAILED" in out
    assert f"last lines of {project / 'setup.log'}" in out
    assert f"retry: cd {project} && PYTHONPATH={project} " in out
    assert "setup had problems" in out


@pytest.mark.slow
@needs_torch
def test_smoke_test_in_this_python_when_no_environment(bake, capfd):
    project = bake(run_smoke_test="yes")
    out = capfd.readouterr().out
    assert "smoke test: in this Python" in out
    assert "scripts/smoke.py ... passed" in out
    assert "ready" in out
    assert "$ " in (project / "setup.log").read_text(encoding="utf-8")


# --- real environments (slow) ---


@pytest.fixture
def torch_pin(tmp_path):
    """Keep torch at the machine's local CPU build (a bare `torch` pulls a CUDA build)."""
    pin = tmp_path / "torch-pin.txt"
    pin.write_text("torch==2.13.0\n")
    return pin


def assert_environment_works(project: Path, out: str) -> None:
    python = project / ".venv" / "bin" / "python"
    check = subprocess.run(
        [str(python), "-c", "import torch, my_pytorch_project; print(torch.__version__)"],
        cwd=project.parent,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("2.13.0")
    assert "smoke test: .venv/bin/python scripts/smoke.py ... passed" in out
    assert "smoke test passed" in (project / "setup.log").read_text(encoding="utf-8")


@pytest.mark.slow
def test_venv_for_real(tmp_path, torch_pin):
    env = clean_environ(PIP_CONSTRAINT=str(torch_pin), COOKIECUTTER_PYTORCH_TORCH_INDEX="")
    answers = ("env_manager=venv", "run_smoke_test=yes", "init_git=yes", "compute=cu128")
    result = run_cli(tmp_path / "out", *answers, env=env)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "out" / "my-pytorch-project"
    assert_environment_works(project, result.stdout)
    log = subprocess.run(
        ["git", "log", "--oneline"], cwd=project, capture_output=True, text=True, check=True
    )
    assert len(log.stdout.splitlines()) == 1
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True, check=True
    )
    assert status.stdout == "", "the environment, the log or the smoke run are not ignored"


def find_uv() -> str | None:
    if shutil.which("uv"):
        return shutil.which("uv")
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    return find_uv_bin()


@pytest.mark.slow
@pytest.mark.skipif(find_uv() is None, reason="uv is not installed (pip install uv)")
def test_uv_for_real(tmp_path, torch_pin):
    uv_bin = str(Path(find_uv()).parent)
    env = clean_environ(
        PATH=os.pathsep.join([uv_bin, os.environ["PATH"]]),
        UV_CONSTRAINT=str(torch_pin),  # uv ignores pip's configuration
        UV_FIND_LINKS=os.environ.get("PIP_FIND_LINKS", "/opt/wheels"),
        COOKIECUTTER_PYTORCH_TORCH_INDEX="",
    )
    answers = ("env_manager=uv", "run_smoke_test=yes", "init_git=no")
    result = run_cli(tmp_path, *answers, env=env)
    assert result.returncode == 0, result.stderr
    assert " venv .venv --python 3.11 ... done" in result.stdout
    assert_environment_works(tmp_path / "my-pytorch-project", result.stdout)


@pytest.mark.slow
def test_failed_install_keeps_the_project(tmp_path):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    env = clean_environ(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(empty), PIP_RETRIES="0")
    answers = ("env_manager=venv", "run_smoke_test=yes", "init_git=no")
    result = run_cli(tmp_path / "out", *answers, env=env)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "out" / "my-pytorch-project"
    assert project.is_dir()
    out = result.stdout
    assert "pip install -r requirements.txt -e '.[dev]' ... FAILED" in out
    assert "retry: cd" in out and "python scripts/create_env.py" in out
    assert "smoke test: in this Python" in out or "smoke test: skipped" in out
    assert "setup had problems" in out
