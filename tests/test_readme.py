"""The template README is the truth: its set-up commands are the ones that work and CI runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEMPLATE


def setup_commands() -> list[str]:
    readme = (TEMPLATE / "README.md").read_text()
    block = re.search(r"## Set up\n+```bash\n(.*?)```", readme, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_has_exactly_two_setup_commands():
    generate, test = setup_commands()
    assert "cookiecutter --no-input" in generate
    assert "pytest" in test


def test_ci_runs_the_readmes_test_command():
    _, test = setup_commands()
    assert test in (TEMPLATE / ".ci" / "run").read_text().splitlines()


def test_readme_generate_command_uses_the_embedded_defaults():
    """In a venv of its own (PEP 668 systems refuse a global pip), with no answer given."""
    generate, _ = setup_commands()
    venv, activate, install, bake = generate.split(" && ")
    assert (venv, activate) == ("python3 -m venv .venv", ". .venv/bin/activate")
    assert install == "pip install cookiecutter"
    assert shlex.split(bake) == ["cookiecutter", "--no-input", ".", "--output-dir", ".."]
    assert "/.venv/" in (TEMPLATE / ".gitignore").read_text().split()  # never committed


def test_readme_test_command_takes_torch_s_cpu_build():
    _, test = setup_commands()
    install, run = test.split(" && ")
    assert shlex.split(install) == [
        *("python", "-m", "pip", "install", "-r", "requirements-dev.txt"),
        *("--extra-index-url", "https://download.pytorch.org/whl/cpu"),
    ]
    assert run == "python -m pytest"


def test_readmes_author_example_bakes_the_author_it_shows(tmp_path):
    """The README shows how to give the author; that line works as written."""
    readme = (TEMPLATE / "README.md").read_text()
    bake = re.search(r"^    (cookiecutter --no-input .*author_name=.*)$", readme, re.M).group(1)
    args = shlex.split(bake)
    assert args[:3] == ["cookiecutter", "--no-input", "."]
    # Without them, "Your Name <you@example.com>" would land in LICENSE and pyproject.toml.
    answers = dict(arg.split("=", 1) for arg in args if "=" in arg)
    assert set(answers) == {"author_name", "author_email"}
    # Run it from a copy-free place: the template is `.` as in a clone; output into tmp.
    args[args.index("--output-dir") + 1] = str(tmp_path)
    env = {**os.environ, "COOKIECUTTER_PYTORCH_SKIP_SETUP": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=TEMPLATE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    project = Path(tmp_path) / "my-pytorch-project"
    assert (project / "my_pytorch_project" / "trainer.py").is_file()
    assert answers["author_name"] in (project / "LICENSE").read_text()
    pyproject = (project / "pyproject.toml").read_text()
    assert answers["author_name"] in pyproject and answers["author_email"] in pyproject


def test_baked_readme_states_the_description_once(bake):
    project = bake(description="Classifies cats.")
    readme = (project / "README.md").read_text()
    assert readme.count("Classifies cats.") == 1
    intro = readme.split("## ")[0].split("\n\n")[1:3]  # the two paragraphs under the title
    assert intro[0] == "Classifies cats." and not intro[1].startswith("A PyTorch project")


@pytest.mark.slow
def test_baked_readme_quick_start_runs(bake):
    """Every command of the baked README's one-screen start, as written, in a fresh bake, then
    those of its environment section. Two are left to other tests: `make env` (the
    real-environment tests of the hooks) and `tensorboard --logdir`, a server (its events are
    checked by the baked suite)."""
    project = bake()
    readme = (project / "README.md").read_text()

    def block(heading: str) -> list[str]:
        pattern = rf"## {heading}\n+(?:[^\n]*\n\n)?```bash\n(.*?)```"
        text = re.search(pattern, readme, re.S).group(1)
        return [line.split("  #")[0].strip() for line in text.splitlines() if line.strip()]

    start, environment = block("Start here"), block("Environment[^\n]*")
    assert start[0] == "make smoke" and "--show-config" in start[-1]
    assert environment[0] == "make env" and environment[-1].startswith("tensorboard --logdir")
    order = [readme.index(f"## {heading}") for heading in ("Start here", "Environment", "Layout")]
    assert order == sorted(order)
    assert len(readme.split("## Start here")[1].split("\n## ")[0].splitlines()) <= 40  # a screen
    env = {**os.environ, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"}
    for command in start + environment[1:-1]:
        proc = subprocess.run(
            command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert (project / "checkpoints" / "default" / "best.pt").is_file()
    assert (project / "checkpoints" / "default" / "predictions.csv").is_file()


@pytest.mark.slow
def test_baked_agents_md_commands_run_as_written(bake):
    """AGENTS.md's commands, as written, in a fresh bake; `make install` and `make test` are
    left to the tests that install a baked project and run its suite."""
    project = bake()
    text = (project / "AGENTS.md").read_text()
    block = re.search(r"## Commands\n+```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands[:2] == ["make install", "make test"] and "--show-config" in commands[-1]
    env = {**os.environ, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"}
    for command in commands[2:]:
        proc = subprocess.run(
            command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert (project / "checkpoints" / "default" / "best.pt").is_file()
