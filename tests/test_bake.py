"""Bake the template through cookiecutter and check what a user gets."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import FAST, TEMPLATE, defaults
from cookiecutter.main import cookiecutter

# Every file a default bake must produce, and nothing else.
EXPECTED = {
    ".cookiecutter.json",
    ".github/workflows/ci.yml",
    ".gitignore",
    ".pre-commit-config.yaml",
    "LICENSE",
    "Makefile",
    "README.md",
    "AGENTS.md",
    *(f"docs/{page}.md" for page in ("after-training", "checkpoints", "combinations", "data")),
    *(f"docs/{page}.md" for page in ("distributed", "extending", "layout", "logging")),
    *(f"docs/{page}.md" for page in ("reliability", "speed", "testing")),
    "docs/sweeps.md",
    "docs/gpu-check.md",
    "environment.yml",
    "pyproject.toml",
    "requirements.txt",
    "checkpoints/README.md",
    "data/README.md",
    "configs/default.yaml",
    "configs/experiments/smoke.yaml",
    "configs/experiments/mlp_large_batch.yaml",
    "configs/experiments/csv_regression.yaml",
    "configs/experiments/finetune_image_folder.yaml",
    "configs/experiments/hf_text_classifier.yaml",
    "configs/experiments/imbalanced_table.yaml",
    "configs/experiments/multilabel_table.yaml",
    "configs/experiments/table_with_test.yaml",
    "configs/experiments/char_lm.yaml",
    "configs/experiments/image_folder.yaml",
    "scripts/train.py",
    "scripts/evaluate.py",
    "scripts/predict.py",
    "scripts/export.py",
    "scripts/smoke.py",
    "scripts/doctor.py",
    "scripts/doctor_checks.py",
    "scripts/create_env.py",
    "scripts/slurm_train.sh",
    "scripts/benchmark_dataloader.py",
    "scripts/benchmark_gpu.py",
    "scripts/gpu_check.py",
    "scripts/gpu_checks/__init__.py",
    "scripts/gpu_checks/common.py",
    "scripts/gpu_checks/numerics.py",
    "scripts/gpu_checks/paths.py",
    "scripts/gpu_checks/ranks.py",
    "scripts/gpu_checks/registry.py",
    "scripts/gpu_checks/report.py",
    "scripts/gpu_checks/speed.py",
    "scripts/gpu_checks/pretrained.py",
    "scripts/gpu_checks/quick.py",
    "scripts/gpu_checks/goldens.py",
    "scripts/sweep.py",
    "scripts/make_demo_data.py",
    "scripts/benchmark_metrics.py",
    "scripts/consolidate.py",
    "scripts/compare_runs.py",
    "scripts/reproduce.py",
    "scripts/_bootstrap.py",
    "PKG/__init__.py",
    "PKG/tools/__init__.py",
    "PKG/tools/cli.py",
    "PKG/tools/train.py",
    "PKG/tools/evaluate.py",
    "PKG/tools/consolidate.py",
    "PKG/tools/formats.py",
    "PKG/config/__init__.py",
    "PKG/config/describe.py",
    "PKG/config/schema.py",
    "PKG/config/text.py",
    "PKG/config/load.py",
    "PKG/config/validate.py",
    "PKG/checkpoint/__init__.py",
    "PKG/checkpoint/files.py",
    "PKG/checkpoint/state.py",
    "PKG/checkpoint/run_folder.py",
    "PKG/checkpoint/resume.py",
    "PKG/checkpoint/sharded.py",
    "PKG/checkpoint/shard_reader.py",
    "PKG/distributed.py",
    "PKG/parallel.py",
    "PKG/fsdp.py",
    "PKG/activation_checkpointing.py",
    "PKG/errors.py",
    "PKG/trainer.py",
    "PKG/loop.py",
    "PKG/validation.py",
    "PKG/summary.py",
    "PKG/tools/report.py",
    "PKG/tools/inference.py",
    "PKG/tools/predict.py",
    "PKG/tools/predict_inputs.py",
    "PKG/tools/predict_text.py",
    "PKG/tools/predict_images.py",
    "PKG/tools/generate.py",
    "PKG/tools/outputs.py",
    "PKG/tools/export.py",
    "PKG/tools/serving.py",
    "PKG/optim.py",
    "PKG/finetune.py",
    "PKG/ema.py",
    "PKG/registry.py",
    "PKG/nonfinite.py",
    "PKG/microbatch.py",
    "PKG/tools/sweep.py",
    "PKG/tools/sweep_cli.py",
    "PKG/tools/sweep_plan.py",
    "PKG/tools/sweep_report.py",
    "PKG/tools/sweep_manifest.py",
    "PKG/tools/sweep_optuna.py",
    "PKG/tools/sweep_study.py",
    "PKG/tools/sweep_launch.py",
    "PKG/tools/sweep_watch.py",
    "PKG/tools/sweep_trials.py",
    "PKG/tools/compare.py",
    "PKG/tools/reproduce.py",
    "PKG/tools/profiling.py",
    "PKG/tools/runs_table.py",
    "PKG/utils/signals.py",
    "PKG/utils/locks.py",
    "PKG/utils/provenance.py",
    "PKG/utils/run_files.py",
    "PKG/data/__init__.py",
    "PKG/data/sampler.py",
    "PKG/data/held_out.py",
    "PKG/data/synthetic.py",
    "PKG/data/tensor_files.py",
    "PKG/data/in_memory.py",
    "PKG/data/folds.py",
    "PKG/data/csv_table.py",
    "PKG/data/label_sets.py",
    "PKG/data/targets.py",
    "PKG/tasks/__init__.py",
    "PKG/tasks/classification.py",
    "PKG/tasks/regression.py",
    "PKG/tasks/language_model.py",
    "PKG/tasks/ranking.py",
    "PKG/tasks/multilabel.py",
    "PKG/tasks/protocol.py",
    "PKG/data/text.py",
    "PKG/data/image_folder.py",
    "PKG/data/image_decode.py",
    "PKG/data/text_table.py",
    "PKG/models/__init__.py",
    "PKG/models/cnn.py",
    "PKG/models/mlp.py",
    "PKG/models/transformer.py",
    "PKG/models/zoo.py",
    "PKG/models/hf.py",
    "PKG/utils/__init__.py",
    "PKG/utils/device.py",
    "PKG/utils/logger.py",
    "PKG/utils/plots.py",
    "PKG/utils/metrics.py",
    "PKG/utils/trackers.py",
    "PKG/utils/tracker_wandb.py",
    "PKG/utils/tracker_mlflow.py",
    "PKG/utils/seed.py",
    "tests/conftest.py",
    "tests/test_config.py",
    "tests/test_models.py",
    "tests/test_train.py",
    "tests/test_splits.py",
    "tests/test_test_split.py",
    "tests/test_balanced_sampler.py",
    "tests/test_csv.py",
    "tests/test_extending.py",
    "tests/test_tasks.py",
    "tests/test_metrics.py",
    "tests/test_sklearn_reference.py",
    "tests/test_imbalance.py",
    "tests/test_multilabel.py",
    "tests/test_finetune.py",
    "tests/test_zoo.py",
    "tests/test_hf.py",
    "tests/test_hf_text.py",
    "tests/test_task_protocol.py",
    "tests/test_faults.py",
    "tests/test_resume.py",
    "tests/test_devices.py",
    "tests/test_bad_input.py",
    "tests/test_hostile_input.py",
    "tests/test_layout.py",
    "tests/test_distributed.py",
    "tests/test_fsdp.py",
    "tests/test_collectives.py",
    "tests/test_doctor.py",
    "tests/test_benchmarks.py",
    "tests/test_cuda.py",
    "tests/test_gpu_check.py",
    "tests/test_gpu_check_quick.py",
    "tests/test_benchmark_gpu.py",
    "tests/test_sweep.py",
    "tests/test_sweep_optuna.py",
    "tests/test_text.py",
    "tests/test_image_folder.py",
    "tests/test_summary.py",
    "tests/test_report.py",
    "tests/test_predict.py",
    "tests/test_outputs.py",
    "tests/test_checkpoint_safety.py",
    "tests/test_export_lengths.py",
    "tests/test_resume_layout.py",
    "tests/test_resume_terms.py",
    "tests/test_torch_floor.py",
    "tests/test_tool_cli.py",
    "tests/test_export.py",
    "tests/test_plots.py",
    "tests/test_compare.py",
    "tests/test_reproduce.py",
    "tests/test_ema.py",
    "tests/test_profiling.py",
    "tests/test_nonfinite.py",
    "tests/test_microbatch.py",
    "tests/test_registry.py",
    "tests/pairwise.py",
    "tests/test_combinations.py",
    "tests/test_end_to_end.py",
    "tests/test_first_hour.py",
    "tests/test_trackers.py",
    "tests/test_locks.py",
}

# What docker=yes adds (tests/test_docker.py checks their content).
DOCKER_FILES = {"Dockerfile", ".dockerignore", ".devcontainer/devcontainer.json"}

AWKWARD = {
    "project_name": 'Ça va? L\'équipe "Quotes" \\ Ünïcode',
    "author_name": 'O\'Brien "The Dev" Müller \\',
    "description": 'Says "hi" and it\'s fine \\',
}


def files_of(project: Path) -> set[str]:
    return {
        str(p.relative_to(project))
        for p in project.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".git" not in p.parts
    }


def test_default_bake_has_exactly_the_expected_files(bake):
    project = bake()
    assert project.name == "my-pytorch-project"
    expected = {f.replace("PKG", "my_pytorch_project") for f in EXPECTED}
    assert files_of(project) == expected


def test_no_template_syntax_survives(bake):
    project = bake(**AWKWARD, docker="yes")
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            # `${{ ... }}` is a GitHub Actions expression (the CI workflow), meant to stay.
            pattern = r"(?<!\$)\{\{|\{%|\{#|cookiecutter\.(?!json)[a-z_]+"
            assert not re.search(pattern, text), path


@pytest.mark.parametrize("context", [{}, AWKWARD, {"project_name": "x", "package_name": "zz_top"}])
def test_metadata_files_stay_valid_with_awkward_answers(bake, context):
    project = bake(**context)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    answers = json.loads((project / ".cookiecutter.json").read_text())
    assert meta["name"] == answers["project_slug"]
    assert meta["description"] == answers["description"]
    assert meta["authors"][0]["name"] == answers["author_name"]
    yaml.safe_load((project / "environment.yml").read_text())
    for path in (project / "configs").rglob("*.yaml"):
        yaml.safe_load(path.read_text())
    pkg = project / answers["package_name"]
    assert (pkg / "__init__.py").is_file()


def test_slug_and_package_are_derived_from_the_name(bake):
    project = bake(project_name="Ça va Model 2")
    answers = json.loads((project / ".cookiecutter.json").read_text())
    assert project.name == answers["project_slug"] == "ca-va-model-2"
    assert answers["package_name"] == "ca_va_model_2"
    assert (project / "ca_va_model_2" / "trainer.py").is_file()


# --- every pair of values of the template's options, baked ---

PAIRWISE = TEMPLATE / "{{cookiecutter.project_slug}}" / "tests" / "pairwise.py"
# run_smoke_test and init_git act after the files are written (test_hooks.py and
# test_env_setup.py test them); every other choice is an axis of the covering array.
SETUP_OPTIONS = ("run_smoke_test", "init_git")
# The files of each feature a project may leave out, and the names that would be a trace of it.
FEATURE_FILES = {
    "fsdp": {
        "PKG/fsdp.py",
        "PKG/checkpoint/sharded.py",
        "PKG/checkpoint/shard_reader.py",
        "PKG/tools/consolidate.py",
        "scripts/consolidate.py",
        "tests/test_fsdp.py",
        "tests/test_checkpoint_safety.py",
    },
    "export": {
        *(f"PKG/tools/{name}.py" for name in ("export", "formats", "serving")),
        "scripts/export.py",
        "tests/test_export.py",
        "tests/test_export_lengths.py",
    },
    "sweeps": {
        *(f"PKG/tools/sweep{part}.py" for part in ("", "_cli", "_plan", "_report", "_manifest")),
        *(f"PKG/tools/sweep_{part}.py" for part in ("optuna", "study", "launch", "watch")),
        "PKG/tools/sweep_trials.py",
        "scripts/sweep.py",
        "tests/test_sweep.py",
        "tests/test_sweep_optuna.py",
        "docs/sweeps.md",
    },
    "trackers": {
        "PKG/utils/tracker_wandb.py",
        "PKG/utils/tracker_mlflow.py",
        "tests/test_trackers.py",
    },
    "text": {
        *(f"PKG/{name}.py" for name in ("data/text", "data/text_table", "tools/generate")),
        *(f"PKG/{name}.py" for name in ("models/transformer", "tasks/language_model")),
        "tests/test_export_lengths.py",
        "PKG/tools/predict_text.py",
        "configs/experiments/char_lm.yaml",
        "configs/experiments/hf_text_classifier.yaml",
        "tests/test_text.py",
        "tests/test_hf_text.py",
    },
    "images": {
        "PKG/data/image_folder.py",
        "PKG/data/image_decode.py",
        "PKG/tools/predict_images.py",
        "configs/experiments/image_folder.yaml",
        "tests/test_image_folder.py",
    },
    "pretrained": {
        *(f"PKG/{name}.py" for name in ("models/zoo", "models/hf", "data/text_table")),
        "PKG/tools/predict_text.py",
        "configs/experiments/finetune_image_folder.yaml",
        "configs/experiments/hf_text_classifier.yaml",
        "scripts/gpu_checks/pretrained.py",
        *(f"tests/{name}.py" for name in ("test_zoo", "test_hf", "test_hf_text")),
    },
    "multilabel": {
        "PKG/tasks/multilabel.py",
        "PKG/data/label_sets.py",
        "configs/experiments/multilabel_table.yaml",
        "tests/test_multilabel.py",
    },
    "gpu_check": {
        "scripts/gpu_check.py",
        *(f"scripts/gpu_checks/{name}.py" for name in ("__init__", "common", "numerics")),
        *(f"scripts/gpu_checks/{name}.py" for name in ("paths", "ranks", "registry")),
        *(f"scripts/gpu_checks/{name}.py" for name in ("report", "speed", "pretrained")),
        *(f"scripts/gpu_checks/{name}.py" for name in ("quick", "goldens")),
        "scripts/benchmark_gpu.py",
        "tests/test_gpu_check.py",
        "tests/test_gpu_check_quick.py",
        "tests/test_benchmark_gpu.py",
        "docs/gpu-check.md",
    },
}
FEATURE_TRACES = {
    # fsdp's words, not torch's: DDP's ShardedSampler and torch.distributed.tensor stay.
    "fsdp": re.compile(
        r"fsdp|fully_shard|\bdcp\b|\.dcp|consolidat|cpu_offload|shard_reader|is_sharded"
        r"|sharded (checkpoint|model|state)|shard (folder|index|file)",
        re.IGNORECASE,
    ),
    # export's words; a shell's `export NAME=` is not one, nor the GPU check's
    # --export-goldens (its loss traces, in every project with the GPU check).
    "export": re.compile(
        r"onnx|torchscript|\.pt2\b|serving|\bexport(s|ed|ing|er)?\b(?! [A-Z_]+=)(?!-goldens)",
        re.IGNORECASE,
    ),
    "sweeps": re.compile(r"sweep|optuna", re.IGNORECASE),
    "trackers": re.compile(r"wandb|mlflow|mlruns", re.IGNORECASE),
    # text's words: reading and generating text, the transformer language model on token ids,
    # Hugging Face text classifiers. The "tokens" kind of targets stays: the task protocol's.
    "text": re.compile(
        r"TextChars|TextTable|text_table|predict_text|HFText|tokenizer|char_lm|hf_text|tickets"
        r"|--prompt|data\.name=text\b|\bBERT\b|language.model|LanguageModel|\btransformer\b"
        r"|Transformer\b|perplexity|export_lengths",
        re.IGNORECASE,
    ),
    # pretrained's words: the zoo models, the Hugging Face ones, their extras and example. The
    # doctor's check of the torch/torchvision pair and image_decode's note that its crop is
    # timm's and torchvision's arithmetic stay: they name libraries, not the feature.
    "pretrained": re.compile(
        r"models/zoo|zoo\.py|test_zoo|test_hf|\bTimm\b|\bTorchvision\b|HFImage|hf_image"
        r"|\[vision\]|\.\[vision|\[hf\]|finetune_image_folder|text_table|Hugging Face"
        r"|save_pretrained|model\.name=(timm|torchvision|hf)\b"
    ),
    # images' words: image folders, decoding image files, Pillow. The CNN and the synthetic
    # images it trains on by default are in every project.
    "images": re.compile(
        r"image_folder|image_decode|ImageFolder|pillow|\bPIL\b|\[images\]|read_images"
        r"|IMAGE_SUFFIXES|write_images|crop_pct|\bphotos\b",
        re.IGNORECASE,
    ),
    # multilabel's words. The "labels" kind of targets (a 0/1 vector per sample) stays: it is
    # the task protocol's, for a task of your own, and so do class imbalance's tools.
    "multilabel": re.compile(
        r"multi-?label|label_sets|label_sep|pos_weight|exact_match|per_label|table_labels"
        r"|image_labels|data\.labels\b",
        re.IGNORECASE,
    ),
    "gpu_check": re.compile(r"gpu[ _-]?checks?|benchmark_gpu", re.IGNORECASE),
}
# The one place a project names what it was generated without: errors.LEFT_OUT, the table of
# what needs an option it left out, errors.UNUSED, the values of those keys that mean "not
# used" (they load), and left_out(), the line refusing the rest.
LEFT_OUT = re.compile(r"LEFT_OUT|UNUSED|left_out\(")
# What the template uses to mark a feature's lines: none may be left in a bake.
MARKS = re.compile(r"^\s*(#|<!--) (>>>|<<<) !?\w+|(#|<!--) feature: !?\w+", re.MULTILINE)


def option_axes() -> dict[str, list]:
    return {
        key: values
        for key, values in defaults().items()
        if isinstance(values, list) and not key.startswith("_") and key not in SETUP_OPTIONS
    }


def covering_cases() -> list[dict]:
    """The baked project's own pairwise generator (tests/pairwise.py) over the options."""
    spec = importlib.util.spec_from_file_location("template_pairwise", PAIRWISE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.covering_cases(option_axes())


CASES = covering_cases()


# The README's rule, restated here rather than read from the hook: {feature: the feature
# that brings it whatever its own answer}.
BROUGHT_BY = {"images": "pretrained", "text": "gpu_check"}


def chosen(case: dict, feature: str) -> bool:
    """The README's rules: a feature answered "preset" is in the full preset, not in lean;
    a feature is chosen where the one that brings it is (BROUGHT_BY)."""
    if feature in BROUGHT_BY and chosen(case, BROUGHT_BY[feature]):
        return True
    value = case[feature]
    return case["preset"] == "full" if value == "preset" else value == "yes"


def expected_files(case: dict, package: str) -> set[str]:
    files = set(EXPECTED)
    for feature, paths in FEATURE_FILES.items():
        if not chosen(case, feature):
            files -= paths
    if case["license"] == "none":
        files.discard("LICENSE")
    if case["ci"] == "none":
        files.discard(".github/workflows/ci.yml")
    if case["docker"] == "yes":
        files |= DOCKER_FILES
    return {f.replace("PKG", package) for f in files}


def test_the_cases_hold_every_pair_of_option_values():
    axes = option_axes()
    assert {"license", "compute", "env_manager", "preset", *FEATURE_FILES} <= set(axes)
    wanted = {
        ((a, va), (b, vb))
        for a, b in itertools.combinations(axes, 2)
        for va in axes[a]
        for vb in axes[b]
    }
    held = {
        ((a, case[a]), (b, case[b])) for case in CASES for a, b in itertools.combinations(axes, 2)
    }
    assert wanted <= held, sorted(wanted - held)[:5]
    # near the least any covering array needs: the two largest choice lists' product
    least = max(len(axes[a]) * len(axes[b]) for a, b in itertools.combinations(axes, 2))
    assert len(CASES) <= 1.25 * least


@pytest.fixture(scope="module")
def baked_cases(tmp_path_factory):
    """Every case baked once (the first with awkward answers), without the setup steps."""
    out = tmp_path_factory.mktemp("cases")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COOKIECUTTER_PYTORCH_SKIP_SETUP", "1")
        projects = []
        for number, case in enumerate(CASES):
            context = {**FAST, **case, **(AWKWARD if number == 0 else {})}
            path = cookiecutter(
                str(TEMPLATE),
                no_input=True,
                extra_context=context,
                output_dir=str(out / str(number)),
            )
            projects.append(Path(path))
    return out, projects


def test_every_case_is_lint_clean(baked_cases):
    """One ruff run over all the cases: each file is checked with its own project's settings."""
    out, _ = baked_cases
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--no-cache"],
            cwd=out,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


@pytest.mark.parametrize("number", range(len(CASES)))
def test_each_case_has_exactly_its_files_and_no_trace_of_what_was_left_out(baked_cases, number):
    case, project = CASES[number], baked_cases[1][number]
    package = json.loads((project / ".cookiecutter.json").read_text())["package_name"]
    assert files_of(project) == expected_files(case, package)
    left_out = [FEATURE_TRACES[f] for f in FEATURE_FILES if not chosen(case, f)]
    for path in project.rglob("*"):
        if not path.is_file() or path.name == ".cookiecutter.json":  # the answers name them
            continue
        text = path.read_text(errors="ignore")
        assert not MARKS.search(text), path
        lines = "\n".join(line for line in text.splitlines() if not LEFT_OUT.search(line))
        for trace in left_out:
            found = trace.search(lines)
            assert found is None, f"{path}: {found and found.group()}"
        if path.suffix == ".py":
            ast.parse(text, filename=str(path))


def test_the_lean_readme_is_a_short_map_and_docs_hold_the_reference(baked_cases):
    """A newcomer reads the README in minutes (the template README states the sizes); the
    reference is one page per topic in docs/, each named by the README."""
    for case, project in zip(CASES, baked_cases[1], strict=True):
        readme = (project / "README.md").read_text()
        if case["preset"] == "lean" and case["docker"] == "no":
            assert len(readme.splitlines()) <= 350, project
        for page in (project / "docs").glob("*.md"):
            assert f"docs/{page.name}" in readme, page.name
            assert page.read_text().startswith("# "), f"{page.name}: a page starts with its title"


@pytest.mark.parametrize("number", range(len(CASES)))
def test_each_case_s_metadata_follows_its_answers(baked_cases, number):
    case, project = CASES[number], baked_cases[1][number]
    license_file = project / "LICENSE"
    if case["license"] != "none":
        assert case["license"].split("-")[0] in license_file.read_text()[:200].replace(" ", "-")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == f">={case['python_version']}"
    answers = json.loads((project / ".cookiecutter.json").read_text())
    assert {key: answers[key] for key in case} == case


def test_every_path_named_by_readme_and_makefile_exists(bake):
    """The paths the baked README, AGENTS.md, Makefile and docs name, from the project's root
    or its package's (`tools/export.py`); the scripts and modules they name bare; the config
    keys they name (a section's, or a registered component's option); and the paths the
    template README names, in the template or in this bake."""
    project = bake()
    package = project / "my_pytorch_project"
    pages = [project / "README.md", project / "Makefile", *(project / "docs").glob("*.md")]
    pages.append(project / "AGENTS.md")
    text = "".join(page.read_text() for page in pages)
    prefixes = "scripts|configs|tests|data|checkpoints|docs|tools|models|tasks|utils|checkpoint"
    path = rf"(?<![\w/.-])((?:{prefixes}|config|my_pytorch_project)/[\w./-]+\.\w+)"
    named = set(re.findall(path, text))
    generated = {
        "checkpoints/default/best.pt",
        "checkpoints/default/last.pt",
        "checkpoints/default/best.full.pt",  # written by scripts/consolidate.py
        "checkpoints/fsdp/best.pt",  # docs/distributed.md's fsdp run
        "checkpoints/fsdp/best.full.pt",
        "checkpoints/default/predictions.csv",  # written by scripts/predict.py --out
        "data/train.pt",
        "data/val.pt",
        "checkpoints/runs.csv",
        "checkpoints/compare.png",  # written by scripts/compare_runs.py checkpoints/*
        "my_pytorch_project/data/my_data.py",  # the README's examples of new files
        "my_pytorch_project/models/my_net.py",
        "my_pytorch_project/tasks/l1.py",
        "data/demo/text.txt",  # written by scripts/make_demo_data.py text
        "data/demo/imbalanced.csv",  # written by scripts/make_demo_data.py csv
        "data/demo/multilabel.csv",
        "data/demo/regression.csv",
    }
    missing = [p for p in named - generated if not (project / p).exists()]
    missing = sorted(p for p in missing if not (package / p).exists())
    assert len(named) > 8 and not missing, missing
    # Scripts and modules by their name alone: `export.py`, `trainer.py`.
    files = {p.name for p in project.rglob("*.py")} | {"my_data.py", "my_net.py", "l1.py"}
    bare = set(re.findall(r"(?<![\w/.-])([a-z_]\w*\.py)\b", text))
    assert bare and not bare - files, sorted(bare - files)
    # Config keys, as `section.key` (not files, nor code's attribute calls).
    script = (
        "import dataclasses, json\n"
        "from my_pytorch_project.config import SECTIONS, COMPONENTS, components, options_type\n"
        "fields = lambda cls: {f.name for f in dataclasses.fields(cls)}\n"
        "keys = {f'{s}.{name}' for s, cls in SECTIONS.items() for name in fields(cls)}\n"
        "for s in COMPONENTS:\n"
        "    for name in components(s):\n"
        "        keys |= {f'{s}.{key}' for key in fields(options_type(s, name))}\n"
        "print(json.dumps(sorted(keys)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(project)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    keys = set(json.loads(proc.stdout or "null") or ()) or pytest.fail(proc.stderr[-2000:])
    said = re.findall(r"(?<![\w/.-])((?:run|data|model|task|train)\.[a-z]\w*)(?![\w(.])", text)
    extensions = r"\.(py|json|yaml|csv|pt|md|png|txt|safetensors|bin)$"
    not_keys = {
        "train.epoch",  # the README's example of an unknown key
        "data.test",  # fields of a checkpoint's data record, named as such
        "data.tuned",
        "model.hidden",  # docs/extending.md's example model's own option
        "data.num_targets",  # an attribute in docs/extending.md's example code
    }
    unknown = {key for key in said if not re.search(extensions, key)} - keys - not_keys
    assert len(set(said)) > 40 and not unknown, sorted(unknown)
    # The template README: its own paths, and the baked project's it describes.
    readme = (TEMPLATE / "README.md").read_text()
    path = rf"(?<![\w/.-])((?:hooks|benchmarks|\.ci|{prefixes}|config)/[\w./-]+\.\w+)"
    named = set(re.findall(path, readme))
    roots = (TEMPLATE, project, package)
    missing = sorted(p for p in named - generated if not any((r / p).exists() for r in roots))
    assert len(named) > 8 and not missing, missing


def test_every_make_target_in_readme_exists(bake):
    project = bake()
    targets = set(re.findall(r"^([a-z-]+):", (project / "Makefile").read_text(), re.M))
    pages = [project / "README.md", project / "AGENTS.md", *(project / "docs").glob("*.md")]
    used = set(re.findall(r"\bmake ([a-z][a-z-]*)", "".join(p.read_text() for p in pages)))
    assert used and used <= targets, used - targets


def test_answers_are_recorded_for_regeneration(bake):
    project = bake(compute="cu128", license="Apache-2.0")
    answers = json.loads((project / ".cookiecutter.json").read_text())
    for key in defaults():
        if not key.startswith("_"):
            assert key in answers
    assert answers["compute"] == "cu128" and answers["license"] == "Apache-2.0"


# requirements-slow.txt: what the baked suite's optional tests import (PIL comes with
# matplotlib).
OPTIONAL_PACKAGES = (
    "matplotlib",
    "PIL",
    "wandb",
    "mlflow",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "optuna",
    "xdist",  # pytest-xdist: the baked suite on every core, as make test-all runs it
)


@pytest.mark.slow
def test_baked_project_passes_its_own_suite(bake):
    """The generated tests, slow ones included, in the baked project (no install: PYTHONPATH).
    Its pyproject's addopts deselect the slow tests; this -m, as `make test-all`'s, replaces
    that selection, and the tests share the cores as there (pytest-xdist)."""
    # The optional packages its tests exercise: absent, those tests would skip unseen.
    missing = [m for m in OPTIONAL_PACKAGES if importlib.util.find_spec(m) is None]
    assert not missing, f"pip install -r requirements-slow.txt first (missing {missing})"
    tail = run_baked_suite(bake(**AWKWARD), "-m", "slow or not slow", "--dist", "worksteal")
    assert "deselected" not in tail, tail


def run_baked_suite(
    project: Path, *args: str, timeout: float = 1500, expect: str = r"\d+ passed"
) -> str:
    """The project's own pytest (no install: PYTHONPATH) on every core; its last lines, once
    it has passed (its summary matches `expect`)."""
    env = {**os.environ, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "--tb=short", "-n", "auto", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    tail = "\n".join(proc.stdout.splitlines()[-80:])
    assert proc.returncode == 0, tail + proc.stderr[-2000:]
    assert re.search(expect, tail), tail
    return tail


# The corners of the options: lean, and each feature alone on top of it (full is the bake
# whose whole suite runs above).
CORNERS = [{"preset": "lean"}, *({"preset": "lean", f: "yes"} for f in FEATURE_FILES)]


@pytest.mark.slow
@pytest.mark.parametrize("answers", CORNERS, ids=lambda a: "+".join([a["preset"], *list(a)[1:]]))
def test_a_corner_bake_passes_its_own_fast_layer(bake, answers):
    """The lean project's `make test`; with a feature alone on top of it, every test module
    is collected (imports) and the fast tests of the feature's files and of the shared files
    with its lines pass: nothing of it leans on another feature."""
    project = bake(**answers)
    (feature,) = list(answers)[1:] or [None]
    if feature is None:
        run_baked_suite(project, timeout=900)
        return
    # -k on the module names: every file is collected, the feature's run.
    files = " or ".join(Path(f).name for f in feature_tests(feature, project))
    tail = run_baked_suite(project, "-k", files, timeout=600)
    assert "error" not in tail.lower(), tail


def feature_tests(feature: str, project: Path) -> list[str]:
    """The project's test files of `feature`: its own, and the shared ones with lines marked
    for it (`# feature: ...` or `# >>> ...` naming it, alone or in an a|b mark)."""
    mark = re.compile(rf"(feature: |>>> )[!\w|]*\b{feature}\b")
    tests = TEMPLATE / "{{cookiecutter.project_slug}}" / "tests"
    marked = {f"tests/{p.name}" for p in tests.glob("test_*.py") if mark.search(p.read_text())}
    own = {f for f in FEATURE_FILES[feature] if f.startswith("tests/")}
    return sorted(f for f in own | marked if (project / f).is_file())
