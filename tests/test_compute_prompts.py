"""The `compute` prompts of cookiecutter.json and the baked doctor's wheel table say the same:
which CUDA version each wheel is built with and the NVIDIA driver it is recommended for."""

from __future__ import annotations

import importlib.util
import re

from conftest import TEMPLATE, defaults

DOCTOR = TEMPLATE / "{{cookiecutter.project_slug}}" / "scripts" / "doctor_checks.py"


def doctor_wheels() -> tuple:
    # doctor_checks.py (the doctor's diagnosis) holds no Jinja, so the template's copy
    # imports as it is.
    spec = importlib.util.spec_from_file_location("template_doctor_checks", DOCTOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WHEELS


def test_every_cuda_compute_choice_is_in_the_doctors_table():
    cuda_choices = {c for c in defaults()["compute"] if c.startswith("cu")}
    assert {w.tag for w in doctor_wheels()} == cuda_choices


def test_compute_prompts_name_the_doctors_cuda_version_and_driver():
    prompts = defaults()["__prompts__"]["compute"]
    for wheel in doctor_wheels():
        prompt = prompts[wheel.tag]
        major, minor = wheel.cuda
        assert prompt.startswith(f"{wheel.tag}: CUDA {major}.{minor} wheel"), prompt
        assert re.findall(r"driver >= (\d+)", prompt) == [str(wheel.driver)], prompt


def test_doctor_table_follows_nvidias_compatibility_rules():
    """CUDA 12.x builds run on any 12.x driver (>= 525 on Linux: minor-version compatibility);
    12.8 is the first for Blackwell (driver >= 570); 13.x needs >= 580."""
    table = {w.tag: (w.driver_cuda, w.driver) for w in doctor_wheels()}
    assert table == {"cu126": ((12, 0), 525), "cu128": ((12, 8), 570), "cu130": ((13, 0), 580)}
