"""Shared fixtures for the template's tests: bake a project through cookiecutter itself."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]

# Bakes in the fast tests skip the heavy post-generation steps; the tests of those steps
# turn them back on explicitly.
# Every tool (the default preset is lean): a test asks for less where it means less.
FAST = {"env_manager": "none", "run_smoke_test": "no", "init_git": "no", "preset": "full"}


# What a copy of the template leaves out: git's data and the ignored folders (the CI's venv).
NOT_TEMPLATE = (".git", ".ci-venv", ".venv", ".gl", ".whl", "build", ".benchmarks")
NOT_TEMPLATE += ("__pycache__", ".pytest_cache", ".ruff_cache")


def copy_template(dest: Path) -> Path:
    """A copy of the template at `dest`, without what git ignores here."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns(*NOT_TEMPLATE))
    return dest


def defaults() -> dict:
    return json.loads((TEMPLATE / "cookiecutter.json").read_text())


# The zoo environment's install (tests/test_zoo_env.py), started once its test is selected.
ZOO_TEST = "tests/test_zoo_env.py"
ZOO = pytest.StashKey[tuple]()


def start_zoo(config) -> tuple:
    from test_zoo_env import start_install

    venv = Path(tempfile.mkdtemp(prefix="zoo-")) / "venv"
    config.stash[ZOO] = (venv, start_install(venv))
    return config.stash[ZOO]


def pytest_collection_finish(session):
    """pip unpacks the zoo's wheels (about 90 s, mostly the disk) while the slow tests before
    it use the cores; under xdist each worker starts it when its test runs instead."""
    selected = any(item.nodeid.startswith(ZOO_TEST) for item in session.items)
    if selected and not hasattr(session.config, "workerinput"):
        start_zoo(session.config)


def pytest_sessionfinish(session):
    venv, install = session.config.stash.get(ZOO, (None, None))
    if install is not None:
        if install.poll() is None:
            install.kill()
        install.wait()
        shutil.rmtree(venv.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def zoo_install(pytestconfig) -> tuple:
    """(venv, its install process): started at collection, or here."""
    return pytestconfig.stash.get(ZOO, None) or start_zoo(pytestconfig)


@pytest.fixture
def bake(tmp_path):
    """Return a function that bakes the template with `extra_context` and returns the project."""

    def _bake(**extra_context) -> Path:
        out = tmp_path / f"bake{len(list(tmp_path.iterdir()))}"
        path = cookiecutter(
            str(TEMPLATE),
            no_input=True,
            extra_context={**FAST, **extra_context},
            output_dir=str(out),
        )
        return Path(path)

    return _bake
