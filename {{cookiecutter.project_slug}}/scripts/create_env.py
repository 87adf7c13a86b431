"""Create this project's environment, then (with --smoke) run the smoke test in it.

The answers given to cookiecutter (in .cookiecutter.json) are the defaults; options override
them. `make env` runs this script, and so does the template's post-generation hook.

    python scripts/create_env.py                  # the tool chosen at generation
    python scripts/create_env.py --manager uv     # another tool
    python scripts/create_env.py --compute cu128  # another PyTorch build
    python scripts/create_env.py --dry-run        # print the commands, run nothing
    python scripts/create_env.py --smoke          # then run scripts/smoke.py in it

Tools: conda, mamba and micromamba create ./.conda-env from environment.yml (Python and pip);
uv and venv create ./.venv; auto takes the first of micromamba, mamba and conda that is
installed, else uv, else venv; none creates nothing. Running it again updates .venv in place
and recreates .conda-env. Then, with every tool, pip (uv pip for uv) installs:
  1. torch alone, from the wheel index of --compute (https://download.pytorch.org/whl/<compute>;
     auto: the default index, that is PyPI's default build). Only this step sees that index:
     an unreachable one fails here once, in seconds, with the fix named;
  2. (not for auto) a check that torch is the build of --compute: a CPU project never keeps
     a CUDA build. A wrong build is uninstalled and the step fails;
  3. requirements.txt and this package (editable, with the dev extra) from the default index;
     torch is already there and stays.

Environment variables:
    COOKIECUTTER_PYTORCH_TORCH_INDEX  where torch comes from instead of the index of --compute:
                                      a wheel index URL (a mirror), or a folder of wheels
                                      (offline: only that folder is used for torch and its
                                      dependencies), or set but empty: the default index.
                                      The build check of step 2 still applies.
    COOKIECUTTER_PYTORCH_SMOKE_ARGS   extra key=value overrides for scripts/smoke.py

Tool output goes to setup.log; its last lines are shown when a step fails. The exit status is
non-zero when a step failed or the tool is missing. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

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
# Run by the new environment's python after the torch step: exit 1 unless torch is the build
# named by argv[1] (cpu, cu126, ...); one line so that --dry-run prints it readably.
CHECK_BUILD = (
    'import sys, torch; v = torch.version; b = "cu" + v.cuda.replace(".", "") if v.cuda else '
    '"rocm" if v.hip else "cpu"; print("torch", torch.__version__, "is a", b, "build"); '
    "sys.exit(b != sys.argv[1])"
)


class Step(NamedTuple):
    """One command of the plan; `kind` (create, torch, check, install) decides the advice
    given when it fails."""

    kind: str
    cmd: list[str]


def say(message: str = "", end: str = "\n") -> None:
    print(message, end=end, flush=True)


def load_answers(project: Path = PROJECT) -> dict:
    """The answers given to cookiecutter, or {} when the project has no .cookiecutter.json."""
    path = project / ".cookiecutter.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def torch_index(compute: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where torch comes from: the environment variable's URL or folder (made absolute), else
    the index of `compute`; None for the default index (compute auto, or the variable empty)."""
    if INDEX_ENV in environ:
        value = environ[INDEX_ENV]
        if not value:
            return None
        return value if is_url(value) else os.path.abspath(os.path.expanduser(value))
    return None if compute == "auto" else TORCH_INDEX_URL.format(compute=compute)


def is_url(index: str) -> bool:
    return "://" in index


def torch_source(index: str | None) -> str:
    """The torch source in words, for the messages."""
    if index is None:
        return "the default index"
    return index if is_url(index) else f"the wheel folder {index}"


def torch_source_args(index: str | None, uv: bool) -> list[str]:
    """The install options that take torch and its dependencies from `index`.

    --index-url (not --extra-index-url) replaces the default index, which then cannot offer a
    higher torch of another build. pip gets --retries 0: it retries 5 times by default, and this
    step is the one that meets an unreachable index first (uv gives up after 3 quick retries).
    A folder of wheels gets --no-index, so that offline the build is the one of the wheels in it.
    """
    if index is None:
        return []
    if not is_url(index):
        return ["--no-index", "--find-links", index]
    return ["--index-url", index] if uv else ["--retries", "0", "--index-url", index]


def torch_requirement(project: Path = PROJECT) -> str:
    """The torch line of requirements.txt (its version range), or plain torch without one."""
    path = project / "requirements.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        requirement = line.split("#", 1)[0].strip()
        if re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower() == "torch":
            return requirement
    return "torch"


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
    extras: tuple[str, ...] = (),
) -> list[Step]:
    """The exact commands, run from the project directory, that create the environment.

    `tool` is the executable (default: the manager's name; for venv, python`python_version`);
    `exists` skips creating an environment that is already there (the installs update it).
    The conda tools take the Python version from environment.yml, and a prefix inside the
    project (./.conda-env) rather than a name: the environment lives and dies with the project
    like .venv, two projects of the same name cannot clash, and its python is at a known path.

    Every tool then installs with pip (uv: uv pip) in three steps (see the top of this file).
    torch is kept out of environment.yml because the options of a pip section (the index)
    apply to every package in it. uv gets --index-url like pip rather than its --torch-backend
    (a preview option of recent uv only): one mechanism, so that COOKIECUTTER_PYTORCH_TORCH_INDEX
    means the same with every tool.
    """
    python = str(env_python(manager, Path(".")))
    if manager in CONDA_TOOLS:
        prefix = str(project / CONDA_ENV_DIR)
        create = [tool or manager, "env", "create", "-y", "-f", "environment.yml", "-p", prefix]
        install = [python, "-m", "pip", "install"]
    elif manager == "uv":
        # --seed puts pip in .venv, so that `make install` and the README's `pip install`
        # (with .venv active) reach this environment, not a pip outside it.
        create = [tool or "uv", "venv", VENV_DIR, "--python", python_version, "--seed"]
        install = [tool or "uv", "pip", "install", "--python", python]
    elif manager == "venv":
        create = [tool or f"python{python_version}", "-m", "venv", VENV_DIR]
        install = [python, "-m", "pip", "install"]
    else:
        return []
    index = torch_index(compute, environ)
    # torchvision is built for one torch release: it comes in torch's call, from its index.
    pair = [torch_requirement(project), *(["torchvision"] if "vision" in extras else [])]
    torch = [*install, *torch_source_args(index, uv=manager == "uv"), *pair]
    steps = [] if exists else [Step("create", create)]
    steps.append(Step("torch", torch))
    if compute != "auto":
        steps.append(Step("check", [python, "-c", CHECK_BUILD, compute]))
    wanted = ",".join(["dev", *extras])
    steps.append(Step("install", [*install, "-r", "requirements.txt", "-e", f".[{wanted}]"]))
    return steps


def uninstall_torch(manager: str, tool: str | None = None) -> list[str]:
    """The command that removes torch from the environment (after a failed build check)."""
    python = str(env_python(manager, Path(".")))
    if manager == "uv":
        return [tool or "uv", "pip", "uninstall", "--python", python, "torch"]
    return [python, "-m", "pip", "uninstall", "-y", "torch"]


def torch_fix(index: str | None, compute: str) -> str:
    """The advice after a failed torch step: where it looked, and how to point it elsewhere."""
    if index is None:
        return (
            f"torch could not be installed from the default index; {INDEX_ENV} can name "
            "another wheel index (URL) or a folder of wheels"
        )
    build = "" if compute == "auto" else f" (the build is then checked to be {compute})"
    if not is_url(index):  # offline: nothing else is looked at, so the folder must hold it all
        return (
            f"torch could not be installed from {torch_source(index)}: it must hold torch's wheel "
            "and the wheels of its dependencies (filelock, sympy, networkx, ...); fill it on a "
            f"machine with network with `pip download '{torch_requirement()}' -d {index}` for "
            f'this platform and Python, or set {INDEX_ENV}="" for the default index{build}'
        )
    return (
        f"torch could not be installed from {torch_source(index)}: if it is unreachable from "
        f"here, set {INDEX_ENV} to a mirror of it, or to a folder of wheels downloaded from it, "
        f'or to "" for the default index{build}'
    )


def build_fix(index: str | None, compute: str, environ: Mapping[str, str] = os.environ) -> str:
    """The advice after a failed build check (the torch found was uninstalled)."""
    source = torch_source(index)
    found = f"torch from {source} is not the {compute} build chosen, so it was removed"
    if INDEX_ENV not in environ:  # a wrong torch was already in the environment
        return f"{found}: the retry installs the {compute} build from {index}"
    return (
        f"{found}: unset {INDEX_ENV} (torch then comes from "
        f"{TORCH_INDEX_URL.format(compute=compute)}), or set it to a {compute} mirror or wheel "
        "folder; or accept any build with --compute auto"
    )


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


def create(
    manager: str, tool: str | None, compute: str, version: str, log: Path, extras: tuple = ()
) -> bool:
    """Create the environment; False when the tool is missing or a step failed."""
    if manager == "none":
        say("  environment: none requested (env_manager=none)")
        return True
    if tool is None:
        where = "MAMBA_EXE, CONDA_EXE and PATH" if manager in CONDA_TOOLS else "PATH"
        say(f"  environment: {manager} not found (looked at {where}).")
        say("    create it later with (or: make env, once it is installed):")
        for step in plan(manager, compute, version, extras=extras):
            say(f"    {shlex.join(step.cmd)}")
        return False
    if manager == "venv" and find_python(version) is None:
        say(f"  python{version} not found: the venv gets this Python ({sys.version.split()[0]})")
    index = torch_index(compute)
    if index is None and compute != "auto":
        say(f"  note: {INDEX_ENV} is empty: torch comes from the default index, checked to be")
        say(f"    a {compute} build (PyPI's default on Linux is a CUDA build)")
    exists = manager not in CONDA_TOOLS and env_python(manager).exists()
    say(
        f"  environment: {manager} -> {env_dir(manager)} (python {version}, "
        f"torch {compute} from {torch_source(index)})"
    )
    for step in plan(manager, compute, version, tool=tool, exists=exists, extras=extras):
        if run_step(shlex.join(step.cmd), step.cmd, log):
            continue
        if step.kind == "torch":
            say(f"    {torch_fix(index, compute)}")
        elif step.kind == "check":
            cmd = uninstall_torch(manager, tool)
            run_step(shlex.join(cmd), cmd, log)
            say(f"    {build_fix(index, compute)}")
        say(f"    retry: cd {shlex.quote(str(PROJECT))} && python scripts/create_env.py")
        return False
    return True


def smoke(manager: str, created: bool, log: Path) -> bool:
    """Run scripts/smoke.py in the new environment; report pass or fail, its time, its last
    line or the log's tail. Never in another Python (this one is cookiecutter's): a pass there
    would say nothing of the project's environment."""
    if not created or manager == "none":
        why = "none was created" if manager == "none" else "creating it failed (above)"
        say(f"  smoke test: skipped, it runs in the project's environment and {why}; once")
        say("    there is one: make smoke (or python scripts/smoke.py in it)")
        return manager == "none"  # not asked for an environment: not a failure
    cmd = smoke_command(str(env_python(manager, PROJECT).relative_to(PROJECT)))
    if not run_step(f"smoke test: {shlex.join(cmd)}", cmd, log, ok="passed"):
        say(f"    retry: cd {shlex.quote(str(PROJECT))} && {shlex.join(cmd)}")
        return False
    lines = [line for line in last_output(log) if line.strip()]
    if lines:
        say(f"    {lines[-1]}")
    return True


def activate_hint(manager: str, project: Path = PROJECT) -> str:
    """The command that enters the environment, from anywhere (the hook runs outside it)."""
    if manager in CONDA_TOOLS:
        return f"conda activate {shlex.quote(str(project / CONDA_ENV_DIR))}"
    if os.name == "nt":
        return rf'cd "{project}" && {VENV_DIR}\Scripts\activate'
    return f"cd {shlex.quote(str(project))} && source {VENV_DIR}/bin/activate"


def next_step(manager: str, created: bool, project: Path = PROJECT) -> str | None:
    """What to do after this script: enter the environment, or make one."""
    if manager == "none":
        return (
            "no environment was created (env_manager=none); make one later with "
            f"`cd {shlex.quote(str(project))} && python scripts/create_env.py --manager venv` "
            "(or uv, conda, mamba, micromamba), or install into your own: "
            "pip install -r requirements.txt -e '.[dev]'"
        )
    return f"activate the environment with: {activate_hint(manager, project)}" if created else None


def parse_args(argv: list[str] | None, answers: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__[__doc__.index("Environment variables:") :].split("\n\nTool output")[0]
        + "\n\nDetails: the top of scripts/create_env.py.",
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
        help="PyTorch build: cpu, a CUDA variant, or auto for PyPI's default",
    )
    parser.add_argument(
        "--python-version",
        default=answers.get(
            "python_version", f"{sys.version_info.major}.{sys.version_info.minor}"
        ),
        help="Python version X.Y, for uv and venv (conda: see environment.yml)",
    )
    parser.add_argument(
        "--extras",
        default="",
        help="optional extras of pyproject.toml to install too, comma-separated (e.g. vision: "
        "torchvision, installed beside torch from its index, and timm)",
    )
    parser.add_argument("--smoke", action="store_true", help="then run scripts/smoke.py in it")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, load_answers())
    manager, tool = resolve_manager(args.manager, args.python_version)
    extras = tuple(e.strip() for e in args.extras.split(",") if e.strip())
    if args.dry_run:
        for step in plan(manager, args.compute, args.python_version, tool=tool, extras=extras):
            say(shlex.join(step.cmd))
        return 0
    log = PROJECT / LOG_NAME  # written only when a command runs
    created = create(manager, tool, args.compute, args.python_version, log, extras)
    passed = smoke(manager, created, log) if args.smoke else True
    hint = next_step(manager, created)
    if hint:
        say(f"  {hint}")
    return 0 if created and passed else 1


if __name__ == "__main__":
    sys.exit(main())
