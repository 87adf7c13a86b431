"""Helpers for the hook tests: render a hook and import it, load create_env.py, run the CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from cookiecutter.environment import StrictEnvironment
from cookiecutter.generate import generate_context
from cookiecutter.prompt import prompt_for_config

TEMPLATE = Path(__file__).resolve().parents[1]
CREATE_ENV = TEMPLATE / "{{cookiecutter.project_slug}}" / "scripts" / "create_env.py"
HOOK_PREFIX = "cookiecutter-pytorch:"  # the start of every line the hooks print
# Variables of the hooks and of create_env.py: a test sets the ones it needs.
HOOK_VARIABLES = (
    "COOKIECUTTER_PYTORCH_SKIP_SETUP",
    "COOKIECUTTER_PYTORCH_SMOKE_ARGS",
    "COOKIECUTTER_PYTORCH_TORCH_INDEX",
)
_count = itertools.count()
# cookiecutter.json's `_extensions` (cookiecutter_pytorch_checks.py) are imported from the
# template folder, which cookiecutter puts on sys.path while it runs; answers() calls its
# functions directly.
if str(TEMPLATE) not in sys.path:
    sys.path.append(str(TEMPLATE))


def answers(check: bool = True, **overrides: str) -> dict:
    """The answers cookiecutter would use with --no-input and these overrides; with
    check=False, bad ones too (as a --replay gives them to the hooks)."""
    skip = {} if check else {"__checked": ""}  # the rendered answer that runs the checks
    context = generate_context(
        str(TEMPLATE / "cookiecutter.json"), extra_context={**overrides, **skip}
    )
    rendered = dict(prompt_for_config(context, no_input=True))
    rendered["_output_dir"] = str(TEMPLATE.parent)
    rendered["_repo_dir"] = str(TEMPLATE)
    return rendered


def load_module(path: Path) -> ModuleType:
    """Import `path` under a fresh name, writing no bytecode next to it (in the template tree,
    a __pycache__ would be baked into every project)."""
    module = ModuleType(f"{path.stem}_{next(_count)}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


def render_hook_file(name: str, workdir: Path, **overrides: str) -> Path:
    """hooks/<name>.py rendered the way cookiecutter renders it, written into `workdir`; the
    answers are not checked first (the hook's own checks are under test)."""
    context = {"cookiecutter": answers(check=False, **overrides)}
    source = (TEMPLATE / "hooks" / f"{name}.py").read_text(encoding="utf-8")
    env = StrictEnvironment(context=context, keep_trailing_newline=True)
    path = workdir / f"{name}_{next(_count)}.py"
    path.write_text(env.from_string(source).render(**context), encoding="utf-8")
    return path


def render_hook(name: str, workdir: Path, **overrides: str) -> ModuleType:
    """hooks/<name>.py rendered the way cookiecutter renders it, then imported."""
    return load_module(render_hook_file(name, workdir, **overrides))


def load_create_env() -> ModuleType:
    """The template's scripts/create_env.py (plain Python: no rendering needed)."""
    return load_module(CREATE_ENV)


def clean_environ(**variables: str) -> dict[str, str]:
    """os.environ without the hooks' variables, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}
    return {**env, **variables}


def run_cli(output_dir: Path, *answers: str, env: dict | None = None):
    """`python -m cookiecutter --no-input <template> key=value... -o <output_dir>`."""
    cmd = [sys.executable, "-m", "cookiecutter", "--no-input", str(TEMPLATE), *answers]
    return subprocess.run(
        [*cmd, "-o", str(output_dir)],
        capture_output=True,
        text=True,
        env=env or clean_environ(),
        timeout=300,
    )


def output_lines(result: subprocess.CompletedProcess) -> list[str]:
    """Every line the command printed, stdout then stderr (cookiecutter prints its errors,
    and the answer checks' lines, on stdout; the hooks print theirs on stderr)."""
    return (result.stdout + result.stderr).splitlines()


def hook_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(HOOK_PREFIX)]
