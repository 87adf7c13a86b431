"""Create this project's environment, then (with --smoke) run the smoke test in it.

The answers given to cookiecutter (in .cookiecutter.json) are the defaults; options override
them. `make env` runs this script, and so does the template's post-generation hook.

    python scripts/create_env.py                  # the tool chosen at generation
    python scripts/create_env.py --manager uv     # another tool
    python scripts/create_env.py --compute cu128  # another PyTorch build (uv, venv)
    python scripts/create_env.py --dry-run        # print the commands, run nothing
    python scripts/create_env.py --smoke          # then run scripts/smoke.py in the environment

Tools: conda, mamba and micromamba create ./.conda-env from environment.yml (which holds the
Python version and the torch wheel index); uv and venv create ./.venv and install
requirements.txt and the package (editable, with the dev extra); auto takes the first of
micromamba, mamba and conda that is installed, else uv, else venv; none creates nothing.
Running it again updates .venv in place and recreates .conda-env.

Environment variables:
    COOKIECUTTER_PYTORCH_TORCH_INDEX  wheel index for torch (uv, venv) instead of the one of
                                      --compute; set but empty: no extra index (PyPI only)
    COOKIECUTTER_PYTORCH_SMOKE_ARGS   extra key=value overrides for scripts/smoke.py

Tool output goes to setup.log; its last lines are shown when a step fails. The exit status is
non-zero when a step failed or the tool is missing. Standard library only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
LOG_NAME = "setup.log"
MANAGERS = ("auto", "conda", "mamba", "micromamba", "uv", "venv", "none")
CONDA_TOOLS = ("micromamba", "mamba", "conda")  # the order in which auto looks for them
COMPUTES = ("auto", "cpu", "cu126", "cu128", "cu130")
TORCH_INDEX_URL = "https://download.pytorch.org/whl/{compute}"
INDEX_ENV = "COOKIECUTTER_PYTORCH_TORCH_INDEX"
SMOKE_ARGS_ENV = "COOKIECUTTER_PYTORCH_SMOKE_ARGS"
CONDA_ENV_DIR = ".conda-env"
VENV_DIR = ".venv"
TAIL_LINES = 20


def say(message: str = "", end: str = "\n") -> None:
    print(message, end=end, flush=True)


def load_answers(project: Path = PROJECT) -> dict:
    """The answers given to cookiecutter, or {} when the project has no .cookiecutter.json."""
    path = project / ".cookiecutter.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def torch_index(compute: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The extra wheel index for torch: the environment variable's, else the one of `compute`."""
    if INDEX_ENV in environ:
        return environ[INDEX_ENV] or None
    return None if compute == "auto" else TORCH_INDEX_URL.format(compute=compute)


def env_dir(manager: str) -> str:
    return CONDA_ENV_DIR if manager in CONDA_TOOLS else VENV_DIR


def env_python(manager: str, project: Path = PROJECT) -> Path:
    """The interpreter inside the environment that `manager` creates."""
    root = project / env_dir(manager)
    if os.name == "nt":
        return root / "python.exe" if manager in CONDA_TOOLS else root / "Scripts" / "python.exe"
    return root / "bin" / "python"


def find_tool(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """Path of conda, mamba, micromamba or uv, or None.

    MAMBA_EXE and CONDA_EXE are set by the tools' shell hooks, and also work when the tool is
    a shell function that is not on PATH.
    """
    for variable in ("MAMBA_EXE", "CONDA_EXE"):
        exe = environ.get(variable, "")
        if exe and Path(exe).stem == name and Path(exe).is_file():
            return exe
    return shutil.which(name, path=environ.get("PATH", os.defpath))


def find_python(version: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """An interpreter of `version` (X.Y): this one if it matches, else pythonX.Y on PATH."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    return shutil.which(f"python{version}", path=environ.get("PATH", os.defpath))


def resolve_manager(
    manager: str, python_version: str, environ: Mapping[str, str] = os.environ
) -> tuple[str, str | None]:
    """(manager, tool): `auto` becomes the tool found; tool is None when it is not installed.

    For venv the tool is the interpreter that creates it: one of `python_version` if there is
    one, else this one.
    """
    if manager == "auto":
        for name in (*CONDA_TOOLS, "uv"):
            exe = find_tool(name, environ)
            if exe:
                return name, exe
        manager = "venv"
    if manager in (*CONDA_TOOLS, "uv"):
        return manager, find_tool(manager, environ)
    if manager == "venv":
        return manager, find_python(python_version, environ) or sys.executable
    return manager, None


def plan(
    manager: str,
    compute: str,
    python_version: str,
    *,
    tool: str | None = None,
    project: Path = PROJECT,
    environ: Mapping[str, str] = os.environ,
    exists: bool = False,
) -> list[list[str]]:
    """The exact commands, run from the project directory, that create the environment.

    `tool` is the executable (default: the manager's name; for venv, python`python_version`);
    `exists` skips creating a .venv that is already there (the install then updates it).
    The conda tools take the Python version and the torch index from environment.yml, and a
    prefix inside the project (./.conda-env) rather than a name: the environment lives and dies
    with the project like .venv, two projects of the same name cannot clash, and its python is
    at a known path. The prefix is absolute because micromamba's pip step fails on a relative one.
    """
    if manager in CONDA_TOOLS:
        prefix = str(project / CONDA_ENV_DIR)
        return [[tool or manager, "env", "create", "-y", "-f", "environment.yml", "-p", prefix]]
    index = torch_index(compute, environ)
    index_args = ["--extra-index-url", index] if index else []
    python = str(env_python(manager, Path(".")))
    packages = ["-r", "requirements.txt", "-e", ".[dev]"]
    if manager == "uv":
        uv = tool or "uv"
        create = [uv, "venv", VENV_DIR, "--python", python_version]
        install = [uv, "pip", "install", "--python", python, *index_args, *packages]
    elif manager == "venv":
        create = [tool or f"python{python_version}", "-m", "venv", VENV_DIR]
        install = [python, "-m", "pip", "install", *index_args, *packages]
    else:
        return []
    return [install] if exists else [create, install]


def smoke_command(python: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """scripts/smoke.py run by `python`, with the overrides of COOKIECUTTER_PYTORCH_SMOKE_ARGS."""
    return [python, "scripts/smoke.py", *shlex.split(environ.get(SMOKE_ARGS_ENV, ""))]


def last_output(log: Path) -> list[str]:
    """The lines that the last command run by run_step wrote to `log`."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return text.rsplit("\n$ ", 1)[-1].splitlines()[1:]


def show_tail(log: Path) -> None:
    say(f"    last lines of {log}:")
    for line in last_output(log)[-TAIL_LINES:]:
        say(f"    | {line}")


def run_step(
    title: str, cmd: list[str], log: Path, env: Mapping[str, str] | None = None, ok: str = "done"
) -> bool:
    """Run `cmd` from the project directory with its output in `log`; report time and result."""
    say(f"  {title} ...", end="")
    start = time.monotonic()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n# {time.ctime()}\n$ {shlex.join(cmd)}\n")
        out.flush()
        try:
            code = subprocess.run(
                cmd, cwd=PROJECT, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env
            ).returncode
        except OSError as err:
            out.write(f"{err}\n")
            code = None
    seconds = time.monotonic() - start
    if code == 0:
        say(f" {ok} ({seconds:.1f} s)")
        return True
    reason = "could not start" if code is None else f"exit {code}"
    say(f" FAILED ({reason}, {seconds:.1f} s)")
    show_tail(log)
    return False


def create(manager: str, tool: str | None, compute: str, version: str, log: Path) -> bool:
    """Create the environment; False when the tool is missing or a step failed."""
    if manager == "none":
        say("  environment: none requested (env_manager=none)")
        return True
    if tool is None:
        where = "MAMBA_EXE, CONDA_EXE and PATH" if manager in CONDA_TOOLS else "PATH"
        say(f"  environment: {manager} not found (looked at {where}).")
        say("    create it later with (or: make env, once it is installed):")
        for cmd in plan(manager, compute, version):
            say(f"    {shlex.join(cmd)}")
        return False
    if manager == "venv" and find_python(version) is None:
        say(f"  python{version} not found: the venv gets this Python ({sys.version.split()[0]})")
    if manager in CONDA_TOOLS and INDEX_ENV in os.environ:
        say(f"  note: {INDEX_ENV} applies to uv and venv; conda reads environment.yml")
    exists = manager not in CONDA_TOOLS and env_python(manager).exists()
    index = "environment.yml" if manager in CONDA_TOOLS else torch_index(compute) or "PyPI only"
    say(f"  environment: {manager} -> {env_dir(manager)} (python {version}, torch index: {index})")
    for cmd in plan(manager, compute, version, tool=tool, exists=exists):
        if not run_step(shlex.join(cmd), cmd, log):
            say(f"    retry: cd {shlex.quote(str(PROJECT))} && python scripts/create_env.py")
            return False
    return True


def smoke_python(manager: str, created: bool) -> tuple[Path | None, dict[str, str]]:
    """The interpreter for the smoke test and the variables it needs on top of os.environ.

    The new environment's python; when none was created, this one if it has torch (with the
    project on PYTHONPATH, since the package is not installed in it); else None.
    """
    if created and manager != "none":
        return env_python(manager), {}
    if importlib.util.find_spec("torch") is None:
        return None, {}
    paths = [str(PROJECT), os.environ.get("PYTHONPATH", "")]
    return Path(sys.executable), {"PYTHONPATH": os.pathsep.join(filter(None, paths))}


def smoke(manager: str, created: bool, log: Path) -> bool:
    """Run scripts/smoke.py; report pass or fail, its time, its last line or the log's tail."""
    python, extra_env = smoke_python(manager, created)
    if python is None:
        say("  smoke test: skipped (no environment was created and this Python has no torch)")
        return False
    if python.is_relative_to(PROJECT):
        python = python.relative_to(PROJECT)
    else:
        say(f"  smoke test: in this Python ({python}), since no environment was created")
    cmd = smoke_command(str(python))
    env = {**os.environ, **extra_env}
    if not run_step(f"smoke test: {shlex.join(cmd)}", cmd, log, env=env, ok="passed"):
        variables = "".join(f"{k}={shlex.quote(v)} " for k, v in extra_env.items())
        say(f"    retry: cd {shlex.quote(str(PROJECT))} && {variables}{shlex.join(cmd)}")
        return False
    lines = [line for line in last_output(log) if line.strip()]
    if lines:
        say(f"    {lines[-1]}")
    return True


def activate_hint(manager: str) -> str:
    if manager in CONDA_TOOLS:
        return f"conda activate {PROJECT / CONDA_ENV_DIR}"
    if os.name == "nt":
        return rf"{VENV_DIR}\Scripts\activate"
    return f"source {VENV_DIR}/bin/activate"


def parse_args(argv: list[str] | None, answers: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="Details: the top of scripts/create_env.py."
    )
    parser.add_argument(
        "--manager",
        choices=MANAGERS,
        default=answers.get("env_manager", "auto"),
        help="tool that creates the environment (default: the answer given at generation)",
    )
    parser.add_argument(
        "--compute",
        choices=COMPUTES,
        default=answers.get("compute", "auto"),
        help="PyTorch build, for uv and venv (conda: see environment.yml)",
    )
    parser.add_argument(
        "--python-version",
        default=answers.get(
            "python_version", f"{sys.version_info.major}.{sys.version_info.minor}"
        ),
        help="Python version X.Y, for uv and venv (conda: see environment.yml)",
    )
    parser.add_argument("--smoke", action="store_true", help="then run scripts/smoke.py in it")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, load_answers())
    manager, tool = resolve_manager(args.manager, args.python_version)
    if args.dry_run:
        for cmd in plan(manager, args.compute, args.python_version, tool=tool):
            say(shlex.join(cmd))
        return 0
    log = PROJECT / LOG_NAME  # written only when a command runs
    created = create(manager, tool, args.compute, args.python_version, log)
    passed = smoke(manager, created, log) if args.smoke else True
    if created and manager != "none":
        say(f"  activate the environment with: {activate_hint(manager)}")
    return 0 if created and passed else 1


if __name__ == "__main__":
    sys.exit(main())
