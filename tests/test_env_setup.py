"""Environment setup: the commands create_env.py builds for every tool and compute variant
(torch alone from its index, the build check, the rest), environment.yml, the advice when the
torch step or the build check fails, the missing-tool message, the smoke test's fail-soft
report, and (slow) real venv and uv environments and a real unreachable torch index.

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
CHECK_BUILD = load_create_env().CHECK_BUILD
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
def test_torch_index_variable_overrides(ce, compute, tmp_path, monkeypatch):
    assert ce.torch_index(compute, {ce.INDEX_ENV: ""}) is None
    assert ce.torch_index(compute, {ce.INDEX_ENV: "file:///w"}) == "file:///w"
    monkeypatch.chdir(tmp_path)  # a folder is taken from where the script is started
    assert ce.torch_index(compute, {ce.INDEX_ENV: "wheels"}) == str(tmp_path / "wheels")


@pytest.mark.parametrize("manager", ["venv", "uv"])
def test_the_vision_extra_gets_torchvision_in_torch_s_call_from_its_index(ce, manager):
    """torchvision is built for one torch release: installed in the same resolver call, from
    the same index, pip picks the pair; the extra's other packages (timm) come after."""
    steps = {s.kind: s.cmd for s in ce.plan(manager, "cu128", "3.11", extras=("vision",))}
    torch = steps["torch"]
    assert torch[-2:] == ["torch>=2.6", "torchvision"]
    assert "https://download.pytorch.org/whl/cu128" in torch
    assert steps["install"][-2:] == ["-e", ".[dev,vision]"]
    plain = {s.kind: s.cmd for s in ce.plan(manager, "cu128", "3.11")}
    assert "torchvision" not in plain["torch"] and plain["install"][-1] == ".[dev]"


def test_torch_requirement_comes_from_requirements_txt(ce, tmp_path):
    assert ce.torch_requirement() == "torch>=2.6"  # the template's requirements.txt
    assert ce.torch_requirement(tmp_path) == "torch"  # no requirements.txt
    (tmp_path / "requirements.txt").write_text(
        "# comment\ntorchmetrics>=1\ntorch >=2.5,<3  # the range\nnumpy\n"
    )
    assert ce.torch_requirement(tmp_path) == "torch >=2.5,<3"


# --- exact commands ---


def expected_installs(manager: str, compute: str, torch_source: list[str]) -> list[list[str]]:
    """The commands after the environment exists: torch alone, the build check, the rest."""
    if manager == "uv":
        install = ["uv", "pip", "install", "--python", ".venv/bin/python"]
    else:
        python = ".conda-env/bin/python" if manager in CONDA_TOOLS else ".venv/bin/python"
        install = [python, "-m", "pip", "install"]
    python = install[4] if manager == "uv" else install[0]
    check = [] if compute == "auto" else [[python, "-c", CHECK_BUILD, compute]]
    return [
        [*install, *torch_source, "torch>=2.6"],
        *check,
        [*install, "-r", "requirements.txt", "-e", ".[dev]"],
    ]


def commands(ce, *args, **kwargs) -> list[list[str]]:
    return [step.cmd for step in ce.plan(*args, **kwargs)]


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("manager", [*CONDA_TOOLS, "uv", "venv"])
def test_commands_of_every_manager_and_compute(ce, manager, compute):
    """torch alone from the variant's index (--index-url, not an extra index that every
    package would try), checked to be that build, then the rest from the default index."""
    project = ce.PROJECT  # the template's project folder: its requirements.txt
    if compute == "auto":
        source = []
    elif manager == "uv":
        source = ["--index-url", INDEX.format(compute)]
    else:
        source = ["--retries", "0", "--index-url", INDEX.format(compute)]
    creates = {
        "uv": ["uv", "venv", ".venv", "--python", "3.12", "--seed"],
        "venv": ["python3.12", "-m", "venv", ".venv"],
        **{
            tool: [tool, "env", "create", "-y", "-f", "environment.yml", "-p"]
            + [str(project / ".conda-env")]
            for tool in CONDA_TOOLS
        },
    }
    installs = expected_installs(manager, compute, source)
    steps = ce.plan(manager, compute, "3.12", project=project, environ={})
    assert [step.cmd for step in steps] == [creates[manager], *installs]
    kinds = ["create", "torch", *(["check"] if compute != "auto" else []), "install"]
    assert [step.kind for step in steps] == kinds
    again = commands(ce, manager, compute, "3.12", project=project, environ={}, exists=True)
    assert again == installs
    for cmd in installs[1:]:
        assert not {"--index-url", "--extra-index-url", "--find-links"} & set(cmd)


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("manager", [*CONDA_TOOLS, "uv", "venv"])
def test_index_variable_reaches_only_the_torch_step(ce, tmp_path, manager, compute):
    def plan(value: str) -> list[list[str]]:
        environ = {ce.INDEX_ENV: value}
        return commands(ce, manager, compute, "3.11", project=ce.PROJECT, environ=environ)[1:]

    # set but empty: the default index, with the build check still there for a chosen build
    assert plan("") == expected_installs(manager, compute, [])
    mirror = ["--index-url", "https://mirror.example/whl/cpu"]
    if manager != "uv":
        mirror = ["--retries", "0", *mirror]
    assert plan("https://mirror.example/whl/cpu") == expected_installs(manager, compute, mirror)
    # a folder of wheels: offline, only the folder, so the build is the one of its wheels
    folder = ["--no-index", "--find-links", str(tmp_path)]
    assert plan(str(tmp_path)) == expected_installs(manager, compute, folder)


def test_conda_tool_path_is_used(ce, tmp_path):
    for tool in CONDA_TOOLS:
        exe = f"/opt/{tool}/bin/{tool}"
        assert commands(ce, tool, "cpu", "3.12", tool=exe, project=tmp_path)[0][0] == exe


def test_uv_and_venv_tool_paths_are_used(ce):
    uv = commands(ce, "uv", "cpu", "3.11", tool="/opt/uv", environ={})
    assert uv[0][0] == uv[1][0] == uv[3][0] == "/opt/uv"
    venv = commands(ce, "venv", "cpu", "3.11", tool="/usr/bin/python3", environ={})
    assert venv[0][0] == "/usr/bin/python3"


def test_none_plans_nothing(ce):
    assert ce.plan("none", "cpu", "3.11") == []


def test_the_last_line_says_what_to_do_next(ce, tmp_path):
    """The hook runs outside the project: the hint must enter it; `none` says how to make one."""
    project = tmp_path / "my project"
    venv = ce.next_step("venv", created=True, project=project)
    assert venv == f"activate the environment with: cd '{project}' && source .venv/bin/activate"
    conda = ce.next_step("micromamba", created=True, project=project)
    assert conda.endswith(f"conda activate '{project / '.conda-env'}'")
    none = ce.next_step("none", created=True, project=project)
    assert "no environment was created" in none
    assert f"cd '{project}' && python scripts/create_env.py --manager venv" in none
    assert ce.next_step("uv", created=False, project=project) is None  # the failure said it


def test_no_command_names_the_dead_pytorch_channel(ce, tmp_path):
    for manager in (*CONDA_TOOLS, "uv", "venv"):
        for compute in COMPUTES:
            for cmd in commands(ce, manager, compute, "3.11", project=tmp_path, environ={}):
                channels = [
                    b for a, b in zip(cmd[:-1], cmd[1:], strict=True) if a in ("-c", "--channel")
                ]
                assert "pytorch" not in cmd and "pytorch" not in channels


@pytest.mark.parametrize("manager", ["uv", "venv", "conda"])
def test_uninstall_torch_command(ce, manager):
    expected = {
        "uv": ["/opt/uv", "pip", "uninstall", "--python", ".venv/bin/python", "torch"],
        "venv": [".venv/bin/python", "-m", "pip", "uninstall", "-y", "torch"],
        "conda": [".conda-env/bin/python", "-m", "pip", "uninstall", "-y", "torch"],
    }
    assert ce.uninstall_torch(manager, "/opt/uv") == expected[manager]


# --- the build check (a cpu project never keeps a CUDA build) ---


def fake_torch(folder: Path, version: str, cuda: str | None, hip: str | None = None) -> Path:
    """A `torch` package that has only what CHECK_BUILD reads."""
    package = folder / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\nfrom types import SimpleNamespace\n"
        f"version = SimpleNamespace(cuda={cuda!r}, hip={hip!r})\n"
    )
    return folder


@pytest.mark.parametrize(
    ("version", "cuda", "hip", "build"),
    [
        ("2.13.0+cpu", None, None, "cpu"),
        ("2.9.0", "12.8", None, "cu128"),  # PyPI's default on Linux
        ("2.9.0+cu126", "12.6", None, "cu126"),
        ("2.9.0+cu130", "13.0", None, "cu130"),
        ("2.9.0+rocm6.4", None, "6.4", "rocm"),
    ],
)
@pytest.mark.parametrize("compute", ["cpu", "cu126", "cu128", "cu130"])
def test_build_check(ce, tmp_path, version, cuda, hip, build, compute):
    path = fake_torch(tmp_path, version, cuda, hip)
    result = subprocess.run(
        [sys.executable, "-c", ce.CHECK_BUILD, compute],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(path)},
    )
    assert result.stdout == f"torch {version} is a {build} build\n", result.stderr
    assert result.returncode == (0 if build == compute else 1)


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
    [("auto", "3.11"), ("cpu", "3.12"), ("cu126", "3.13"), ("cu128", "3.12"), ("cu130", "3.11")],
)
def test_environment_yml(bake, compute, python_version):
    """Python and pip only: torch comes in a step of its own (a pip section's index would apply
    to every package in it), then requirements.txt and the package."""
    project = bake(compute=compute, python_version=python_version)
    env = yaml.safe_load((project / "environment.yml").read_text(encoding="utf-8"))
    assert env["channels"] == ["conda-forge"]
    assert env["dependencies"] == [f"python={python_version}", "pip"]
    text = (project / "environment.yml").read_text(encoding="utf-8")
    assert not [line for line in text.splitlines() if "index" in line and "#" not in line]
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
        ".venv/bin/python -m pip install --retries 0 --index-url"
        " https://download.pytorch.org/whl/cu128 'torch>=2.6'"
    )
    assert lines[2].startswith(".venv/bin/python -c 'import sys, torch;")
    assert lines[2].endswith("' cu128")
    assert lines[3] == ".venv/bin/python -m pip install -r requirements.txt -e '.[dev]'"
    assert len(lines) == 4
    override = run_script(
        project, "--dry-run", "--manager", "uv", COOKIECUTTER_PYTORCH_TORCH_INDEX=""
    )
    assert "--index-url" not in override.stdout
    assert " cu128\n" in override.stdout  # the build is still checked


def test_help(bake):
    result = run_script(bake(), "--help")
    assert result.returncode == 0
    assert "--manager" in result.stdout and "--smoke" in result.stdout
    assert "COOKIECUTTER_PYTORCH_TORCH_INDEX  where torch comes from" in result.stdout
    assert "a folder of wheels" in result.stdout


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
    monkeypatch.setattr(ce, "plan", lambda *args, **kwargs: [ce.Step("create", failing)])
    log = tmp_path / "setup.log"
    assert ce.create("venv", sys.executable, "cpu", "3.11", log) is False
    out = capsys.readouterr().out
    assert "FAILED (exit 3" in out
    assert f"last lines of {log}" in out
    assert "| boom: no wheel" in out
    assert "retry: cd" in out and "python scripts/create_env.py" in out


def fail_at(ce, monkeypatch, tmp_path, kind: str) -> list[list[str]]:
    """Make create() run a plan whose `kind` step fails; return the commands it ran."""
    monkeypatch.setattr(ce, "PROJECT", tmp_path)
    ran = []
    ok = [sys.executable, "-c", "pass"]
    failing = [sys.executable, "-c", "import sys; print('torch 2.9.0 is a cu128 build'); exit(1)"]
    steps = [ce.Step(k, failing if k == kind else ok) for k in ("create", "torch", "check")]
    steps.append(ce.Step("install", ok))
    monkeypatch.setattr(ce, "plan", lambda *args, **kwargs: steps)
    monkeypatch.setattr(ce, "uninstall_torch", lambda *args: [sys.executable, "-c", "pass"])
    real_run_step = ce.run_step
    monkeypatch.setattr(
        ce, "run_step", lambda t, cmd, *a: ran.append(cmd) or real_run_step(t, cmd, *a)
    )
    return ran


@pytest.mark.parametrize(
    ("index", "where"),
    [
        (None, "https://download.pytorch.org/whl/cpu"),
        ("http://127.0.0.1:9/simple", "http://127.0.0.1:9/simple"),
    ],
)
def test_failed_torch_step_names_the_index_and_the_fix(
    ce, tmp_path, monkeypatch, capsys, index, where
):
    if index is not None:
        monkeypatch.setenv(ce.INDEX_ENV, index)
    ran = fail_at(ce, monkeypatch, tmp_path, "torch")
    assert ce.create("venv", sys.executable, "cpu", "3.11", tmp_path / "setup.log") is False
    out = capsys.readouterr().out
    assert len(ran) == 2  # create, torch: nothing after the failure
    (line,) = [line for line in out.splitlines() if "torch could not be installed" in line]
    assert f"from {where}: if it is unreachable from here, set {ce.INDEX_ENV} to a mirror" in line
    assert 'or to "" for the default index (the build is then checked to be cpu)' in line
    assert out.rstrip().splitlines()[-1].startswith("    retry: cd ")


def test_a_wheel_folder_without_torch_s_dependencies_is_named_as_the_cause(
    ce, tmp_path, monkeypatch, capsys
):
    """Offline, the folder is the only source: without filelock & co. pip fails on them."""
    monkeypatch.setenv(ce.INDEX_ENV, "/srv/wheels")
    fail_at(ce, monkeypatch, tmp_path, "torch")
    assert ce.create("venv", sys.executable, "cpu", "3.11", tmp_path / "setup.log") is False
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "torch could not be installed" in line]
    assert "from the wheel folder /srv/wheels: it must hold torch's wheel and the" in line
    assert "pip download 'torch>=2.6' -d /srv/wheels" in line
    assert "unreachable" not in line


def test_wrong_build_is_uninstalled_and_the_fix_named(ce, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ce.INDEX_ENV, "")
    ran = fail_at(ce, monkeypatch, tmp_path, "check")
    assert ce.create("uv", "uv", "cpu", "3.11", tmp_path / "setup.log") is False
    out = capsys.readouterr().out
    assert f"note: {ce.INDEX_ENV} is empty: torch comes from the default index" in out
    assert "| torch 2.9.0 is a cu128 build" in out  # the check's own line, from the log
    assert len(ran) == 4  # create, torch, check, then the uninstall; not the install
    assert ran[-1] == [sys.executable, "-c", "pass"]
    (line,) = [line for line in out.splitlines() if "is not the cpu build chosen" in line]
    assert line.startswith("    torch from the default index is not the cpu build chosen, so")
    assert f"unset {ce.INDEX_ENV} (torch then comes from {INDEX.format('cpu')})" in line
    assert "retry: cd " in out


def test_wrong_build_already_in_the_environment(ce, tmp_path, monkeypatch, capsys):
    fail_at(ce, monkeypatch, tmp_path, "check")
    assert ce.create("venv", sys.executable, "cu126", "3.11", tmp_path / "setup.log") is False
    out = capsys.readouterr().out
    assert "note:" not in out
    index = INDEX.format("cu126")
    assert f"so it was removed: the retry installs the cu126 build from {index}" in out


@needs_torch
@pytest.mark.parametrize(
    "broken", ["train.lr=-1", pytest.param("train.epochs=oops", marks=pytest.mark.slow)]
)
def test_failed_smoke_test_shows_the_log_and_the_retry(ce, bake, broken, monkeypatch, capsys):
    """The smoke test runs in the project's environment: here a .venv/bin/python that is this
    Python (which has torch) with the project on its path."""
    project = bake()
    python = project / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(ce, "PROJECT", project)
    monkeypatch.setenv("PYTHONPATH", str(project))
    monkeypatch.setenv(ce.SMOKE_ARGS_ENV, broken)
    assert ce.smoke("venv", True, project / "setup.log") is False
    out = capsys.readouterr().out
    assert f"smoke test: .venv/bin/python scripts/smoke.py {broken} ... FAILED" in out
    assert f"last lines of {project / 'setup.log'}" in out
    assert f"retry: cd {project} && .venv/bin/python scripts/smoke.py {broken}" in out


@pytest.mark.parametrize("manager", ["none", "venv"])
def test_no_smoke_test_outside_the_project_environment(ce, manager, tmp_path, capsys):
    """Without the project's environment (none asked for, or creating it failed) the smoke
    test is skipped rather than run in cookiecutter's Python, where a pass proves nothing."""
    log = tmp_path / "setup.log"
    assert ce.smoke(manager, False, log) is (manager == "none")
    out = capsys.readouterr().out
    why = "none was created" if manager == "none" else "creating it failed (above)"
    assert f"smoke test: skipped, it runs in the project's environment and {why}" in out
    assert "make smoke" in out and not log.exists()


def test_generation_without_environment_runs_no_smoke_test(bake, capfd):
    project = bake(run_smoke_test="yes")  # env_manager=none
    out = capfd.readouterr().out
    assert "smoke test: skipped, it runs in the project's environment and none was created" in out
    assert "cookiecutter-pytorch: ready" in out
    assert not (project / "setup.log").exists()


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
    log = (project / "setup.log").read_text(encoding="utf-8")
    assert "smoke test passed" in log
    assert "torch 2.13.0+cpu is a cpu build" in log  # the build check ran and passed
    assert " cpu ... done" in out


@pytest.mark.slow
def test_venv_for_real(tmp_path, torch_pin):
    # As CI does: the torch index set to "" (the default index, here the local CPU wheel); the
    # build check still holds the project to its cpu build.
    env = clean_environ(PIP_CONSTRAINT=str(torch_pin), COOKIECUTTER_PYTORCH_TORCH_INDEX="")
    answers = ("env_manager=venv", "run_smoke_test=yes", "init_git=yes", "compute=cpu")
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


needs_uv = pytest.mark.skipif(find_uv() is None, reason="uv is not installed (pip install uv)")


@pytest.mark.slow
@needs_uv
def test_uv_for_real_from_a_wheel_folder(tmp_path, torch_pin):
    """The README's offline path: torch and its dependencies downloaded into a folder, which
    is then the only source of torch (the build of its wheels is kept)."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "torch==2.13.0", "-d", str(wheels)],
        check=True,
        timeout=600,
    )
    env = clean_environ(
        PATH=os.pathsep.join([str(Path(find_uv()).parent), os.environ["PATH"]]),
        UV_CONSTRAINT=str(torch_pin),  # uv ignores pip's configuration
        UV_FIND_LINKS=os.environ.get("PIP_FIND_LINKS", "/opt/wheels"),
        COOKIECUTTER_PYTORCH_TORCH_INDEX=str(wheels),
    )
    answers = ("env_manager=uv", "run_smoke_test=yes", "init_git=no", "compute=cpu")
    result = run_cli(tmp_path, *answers, env=env)
    assert result.returncode == 0, result.stderr
    assert " venv .venv --python 3.11 --seed ... done" in result.stdout
    assert f"--no-index --find-links {wheels} 'torch>=2.6' ... done" in result.stdout
    project = tmp_path / "my-pytorch-project"
    assert_environment_works(project, result.stdout)
    # make install and the README's `pip install ...` (with .venv active) need pip in .venv
    python = str(project / ".venv/bin/python")
    pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(project / ".venv") in pip.stdout, pip.stderr


UNREACHABLE = "http://127.0.0.1:9/simple"  # nothing listens on port 9: refused at once


@pytest.mark.slow
@pytest.mark.parametrize("manager", ["venv", pytest.param("uv", marks=needs_uv)])
def test_unreachable_torch_index_fails_once_with_the_fix(bake, manager):
    project = bake(compute="cpu")  # no environment yet
    env = clean_environ(COOKIECUTTER_PYTORCH_TORCH_INDEX=UNREACHABLE, PIP_CONFIG_FILE=os.devnull)
    for name in ("PIP_FIND_LINKS", "UV_FIND_LINKS"):  # no other source of torch
        env.pop(name, None)
    if manager == "uv":
        env["PATH"] = os.pathsep.join([str(Path(find_uv()).parent), env["PATH"]])
    result = subprocess.run(
        [sys.executable, "scripts/create_env.py", "--manager", manager],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # a generous bound: pip once used to spend minutes on retries
    )
    out = result.stdout
    assert result.returncode == 1, out
    assert f"--index-url {UNREACHABLE} 'torch>=2.6' ... FAILED" in out
    assert "requirements.txt" not in out  # nothing else went to any index
    fix = f"torch could not be installed from {UNREACHABLE}: if it is unreachable from here, "
    assert f"{fix}set COOKIECUTTER_PYTORCH_TORCH_INDEX to a mirror of it" in out
    assert (
        out.rstrip().splitlines()[-1] == f"    retry: cd {project} && python scripts/create_env.py"
    )


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
    assert "pip install 'torch>=2.6' ... FAILED" in out
    assert "torch could not be installed from the default index" in out
    assert "retry: cd" in out and "python scripts/create_env.py" in out
    assert "it runs in the project's environment and creating it failed" in out
    assert "setup had problems" in out
