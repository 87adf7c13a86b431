"""The template README is the truth: its set-up commands are the ones that work and CI runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import TEMPLATE
from test_doc_runner import collect


def setup_commands() -> list[str]:
    """The set-up block's commands. It is marked `needs network` (pip reaches PyPI), so the
    doc-runner leaves it to these tests, which check it piece by piece and run its bake."""
    readme = (TEMPLATE / "README.md").read_text()
    (block,) = collect(readme.split("## Set up")[1].split("\n## ")[0], "README.md")
    assert block.needs == ("network",)
    return block.commands


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


def test_baked_readme_starts_with_one_screen_of_commands(bake):
    """The README's first section is the one-screen start: the smoke test, then train,
    evaluate, predict and the settings (tests/test_doc_runner.py runs them, as every block)."""
    readme = (bake() / "README.md").read_text()
    start = readme.split("## Start here")[1].split("\n## ")[0]
    (block,) = collect(start, "README.md")
    assert block.commands[0].startswith("make smoke") and not block.needs
    assert "--show-config" in block.commands[-1]
    order = [readme.index(f"## {heading}") for heading in ("Start here", "Environment", "Layout")]
    assert order == sorted(order)
    assert len(start.splitlines()) <= 40  # a screen
