"""The registries (DATASETS, MODELS, TASKS) import a component when a run names it: every
entry imports and is a class, and a run loads the ones it names, not the others."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, TINY

from {{ cookiecutter.package_name }}.data import DATASETS
from {{ cookiecutter.package_name }}.models import MODELS
from {{ cookiecutter.package_name }}.tasks import TASKS

PACKAGE = "{{ cookiecutter.package_name }}"
REGISTRIES = {"data": DATASETS, "models": MODELS, "tasks": TASKS}


@pytest.mark.parametrize("section", sorted(REGISTRIES))
def test_every_entry_imports_a_class_with_its_options(section):
    registry = REGISTRIES[section]
    for name in registry:
        where = registry.module(name)  # named before the import, found after it
        component = registry[name]
        assert isinstance(component, type), f"{section} {name}: {component!r}"
        assert component.__module__ == where
        assert "Options" not in vars(component) or isinstance(component.Options, type)


def test_names_and_membership_import_nothing():
    code = (
        f"import sys; from {PACKAGE}.data import DATASETS; "
        "names = list(DATASETS); assert 'csv' in DATASETS and 'nothing' not in DATASETS; "
        f"print(sorted(m for m in sys.modules if m.startswith('{PACKAGE}.data.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert "csv_table" not in loaded.stdout and "synthetic" not in loaded.stdout


# What the default run does not use, and must not load (the options that need them are off).
UNUSED = ["activation_checkpointing", "tools.profiling", "tools.evaluate", "tasks.ranking"]


# Run in a fresh process: the registries before any lookup, the run, then what it loaded.
RUN = """
import json, sys
from PKG.config import load_config
from PKG.data import DATASETS
from PKG.models import MODELS
from PKG.tasks import TASKS
registries = dict(data=DATASETS, models=MODELS, tasks=TASKS)
entries = dict((section, dict((n, r.module(n)) for n in r)) for section, r in registries.items())
from PKG.trainer import fit
fit(load_config(None, sys.argv[1:]))
loaded = sorted(m for m in sys.modules if m.startswith("PKG."))
print(json.dumps(dict(entries=entries, loaded=loaded)))
"""


def test_a_run_loads_the_components_it_names_and_not_the_others(tmp_path):
    args = [*TINY, f"run.output_dir={tmp_path}"]
    command = [sys.executable, "-c", RUN.replace("PKG", PACKAGE), *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = set(found["loaded"])
    chosen = {"data": "synthetic", "models": "cnn", "tasks": "classification"}
    for section, entries in found["entries"].items():
        assert chosen[section] in entries
        for name, module in entries.items():
            assert (module in loaded) == (name == chosen[section]), (name, module)
    assert loaded.isdisjoint(f"{PACKAGE}.{name}" for name in UNUSED)
