"""Tests for scripts/doctor.py and its diagnosis (scripts/doctor_checks.py): every diagnosis
from fake facts, plus one real run here."""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

SCRIPT = Path(__file__).parents[1] / "scripts" / "doctor.py"
doctor = load_script("doctor")  # it imports doctor_checks, from beside it
diagnosis = sys.modules["doctor_checks"]

HEALTHY = {
    "python": {"version": "3.11.7", "requires": [3, 10], "env": "virtual env /p/.venv"},
    "torch": {
        "ok": True,
        "version": "2.13.0+cu128",
        "cuda": "12.8",
        "hip": None,
        "cudnn": 91002,
        "mps": False,
        "cuda_available": True,
        "cuda_warning": None,
        "gpus": ["NVIDIA H100 80GB HBM3"],
        "capability": [9, 0],
        "bf16": True,
        "nccl": True,
        "matmul_error": None,
        "threads": 4,
    },
    "smi": {"present": True, "driver": "570.86.15", "cuda": "12.8", "gpus": ["NVIDIA H100"]},
    "cpu": {"machine": 16, "usable": 16, "load": 2.5},
    "env": {},
    "imports": dict.fromkeys((*doctor.DEPS, "mypkg"), (True, "1.0")),
    "package": "mypkg",
    "platform": "linux",
    "tf32": True,  # train.tf32 in the project's configs/default.yaml
}
CPU_TORCH = {"ok": True, "version": "2.13.0+cpu", "cuda": None, "hip": None, "cudnn": None}
CPU_TORCH.update(mps=False, cuda_available=False, cuda_warning=None)
NO_SMI = {"present": False}


def facts(torch=None, smi=None, env=None, **over):
    f = copy.deepcopy(HEALTHY)
    if torch is not None:
        f["torch"] = {**f["torch"], **torch} if torch.get("ok", True) else torch
    f["smi"] = smi if smi is not None else f["smi"]
    f["env"] = env or {}
    return {**f, **over}


def statuses(checks):
    return [c.status for c in checks]


def failures(checks):
    return [c.message for c in checks if c.status == "FAIL"]


def test_healthy_cuda_is_all_ok():
    checks = doctor.diagnose(facts())
    assert set(statuses(checks)) == {"ok"}, checks
    text = "\n".join(c.message for c in checks)
    assert "CUDA works" in text and "matmul" in text and "bf16" in text and "NCCL" in text
    assert "TF32" in text  # H100 is Ampere+


def test_cpu_machine_with_cpu_build_is_ok():
    checks = doctor.diagnose(facts(torch=CPU_TORCH, smi=NO_SMI))
    assert "FAIL" not in statuses(checks) and "warn" not in statuses(checks), checks
    assert any("CPU build is right" in c.message for c in checks)


def test_cpu_build_with_gpu_present_fails_with_reinstall_command():
    (msg,) = failures(diagnosis.diagnose_cuda(facts(torch=CPU_TORCH)))
    assert "CPU build (2.13.0+cpu)" in msg and "570.86.15" in msg
    assert "--index-url https://download.pytorch.org/whl/cu128" in msg


@pytest.mark.parametrize(
    "error",
    [
        "ImportError: libc10_cuda.so: cannot open shared object file: No such file or directory",
        "OSError: libcudnn.so.9: cannot open shared object file: No such file or directory",
        "ImportError: /x/libtorch_cuda.so: undefined symbol: cudaGraphInstantiateWithParams",
    ],
)
def test_cuda_library_import_error_names_the_mismatch(error):
    broken = {"ok": False, "returncode": 1, "error": f"Traceback...\n  File x\n{error}"}
    env = {"LD_LIBRARY_PATH": "/usr/local/cuda-11.8/lib64"}
    checks = doctor.diagnose(facts(torch=broken, env=env))
    (msg,) = failures(checks)
    assert error in msg and "doesn't match the driver/libs" in msg
    assert "LD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64" in msg and "--index-url" in msg


def test_other_import_errors_show_the_exception_line():
    missing = {"ok": False, "returncode": 1, "error": "No module named 'torch'"}
    (msg,) = failures(diagnosis.diagnose_torch(facts(torch=missing)))
    assert "not installed" in msg
    odd = {"ok": False, "returncode": 1, "error": "Traceback\nRuntimeError: numpy ABI mismatch"}
    (msg,) = failures(diagnosis.diagnose_torch(facts(torch=odd)))
    assert msg.endswith("RuntimeError: numpy ABI mismatch")
    crash = {"ok": False, "returncode": -11, "error": "no output"}
    assert "crashed" in failures(diagnosis.diagnose_torch(facts(torch=crash)))[0]


def test_driver_too_old_for_the_wheel_names_the_driver():
    smi = {"present": True, "driver": "535.183.01", "cuda": "12.2", "gpus": ["Tesla V100"]}
    torch = {"cuda_available": False, "cuda_warning": "CUDA initialization: driver too old"}
    (msg,) = failures(diagnosis.diagnose_cuda(facts(torch=torch, smi=smi)))
    assert "driver 535.183.01 is too old" in msg and "12.2" in msg and "12.8" in msg
    assert ">= 570" in msg and "whl/cu126" in msg  # 12.x drivers run the cu126 wheel


@pytest.mark.parametrize(
    ("driver_cuda", "tag"),
    [("13.0", "cu130"), ("12.9", "cu128"), ("12.6", "cu126"), ("12.2", "cu126"), (None, "cu130")],
)
def test_wheel_for_driver(driver_cuda, tag):
    assert diagnosis.wheel_for({"cuda": driver_cuda})[0] == tag
    assert diagnosis.wheel_for({"cuda": "11.8"}) is None


@pytest.mark.parametrize("value", ["", "-1"])
def test_hidden_cuda_visible_devices_is_named(value):
    env = {"CUDA_VISIBLE_DEVICES": value}
    checks = diagnosis.diagnose_cuda(facts(torch={"cuda_available": False}, env=env))
    assert any(f"CUDA_VISIBLE_DEVICES={value!r}" in c.message for c in checks), checks


def test_cuda_build_without_driver_only_warns():
    checks = diagnosis.diagnose_cuda(facts(torch={"cuda_available": False}, smi=NO_SMI))
    assert statuses(checks) == ["warn"] and "login" in checks[0].message


def test_unexplained_unavailable_cuda_fails_with_the_reason():
    torch = {"cuda_available": False, "cuda_warning": "CUDA unknown error"}
    env = {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}
    (msg,) = failures(diagnosis.diagnose_cuda(facts(torch=torch, env=env)))
    assert "CUDA unknown error" in msg and "LD_LIBRARY_PATH=/opt/cuda/lib64" in msg


def test_tf32_is_reported_as_training_sets_it():
    """A fresh process has TF32 off whatever the project does, so the doctor reported it off;
    training turns it on by default (train.tf32). The line says what training does and names
    the setting that changes it."""
    fresh = {"tf32": "highest"}  # torch.get_float32_matmul_precision() in a new process
    (on,) = [c for c in diagnosis.diagnose_cuda(facts(torch=fresh)) if "TF32" in c.message]
    assert on.status == "ok" and "training uses TF32" in on.message
    assert "train.tf32=false" in on.message and "set_float32_matmul_precision" not in on.message
    (off,) = [c.message for c in diagnosis.diagnose_cuda(facts(tf32=False)) if "TF32" in c.message]
    assert "full fp32" in off and "train.tf32=true" in off
    (unknown,) = [
        c.message for c in diagnosis.diagnose_cuda(facts(tf32=None)) if "TF32" in c.message
    ]
    assert "train.tf32" in unknown


def test_tf32_default_is_read_from_the_project_config(tmp_path):
    assert doctor.probe_tf32(doctor.ROOT) is True  # configs/default.yaml: train.tf32: true
    (tmp_path / "configs").mkdir()
    assert doctor.probe_tf32(tmp_path) is None
    (tmp_path / "configs" / "default.yaml").write_text("train:\n  tf32: false  # off\n")
    assert doctor.probe_tf32(tmp_path) is False


def test_weak_gpu_warns_and_broken_matmul_fails():
    torch = {"bf16": False, "nccl": False, "capability": [7, 0], "matmul_error": "no kernel image"}
    checks = diagnosis.diagnose_cuda(facts(torch=torch))
    assert statuses(checks).count("warn") == 2 and len(failures(checks)) == 1
    assert not any("TF32" in c.message for c in checks)


@pytest.mark.parametrize(
    ("capability", "bf16", "native"),
    [
        ([9, 0], True, True),  # H100
        ([8, 0], True, True),  # A100
        ([7, 0], True, False),  # V100: torch.cuda.is_bf16_supported() counts emulation
        ([7, 5], False, False),  # T4, as an older torch reports it
    ],
)
def test_bf16_is_native_only_from_compute_capability_8(capability, bf16, native):
    checks = diagnosis.diagnose_cuda(facts(torch={"capability": capability, "bf16": bf16}))
    (check,) = [c for c in checks if "bf16" in c.message]
    if native:
        assert check == ("ok", "native bf16: train.amp=bf16 is the fast choice")
        return
    major, minor = capability
    assert check.status == "warn" and f"compute capability {major}.{minor}" in check.message
    assert "train.amp=fp16" in check.message and "GradScaler" in check.message
    assert ("emulates it" in check.message) == bf16


def test_oversubscribed_machine_warns_with_the_figures_and_the_fix():
    cpu = {"machine": 2, "usable": 2, "load": 6.7}
    checks = diagnosis.diagnose_cpu(facts(cpu=cpu, torch={"threads": 2}))
    assert statuses(checks) == ["ok", "warn"], checks
    assert checks[0].message == "torch uses 2 CPU threads per process; 2 CPUs usable here"
    warning = checks[1].message
    assert "load 6.7" in warning and "on 2 CPUs" in warning and "oversubscribed" in warning
    assert "run.threads=1 per process" in warning and "fewer jobs in parallel" in warning


def test_load_is_measured_against_the_machine_and_threads_against_usable_cpus():
    # A job pinned to 4 CPUs of a busy 64-CPU node: its own CPUs are not oversubscribed.
    cpu = {"machine": 64, "usable": 4, "load": 40.0}
    checks = diagnosis.diagnose_cpu(facts(cpu=cpu, torch={"threads": 8}))
    assert statuses(checks) == ["warn", "ok"], checks
    assert "torch uses 8 CPU threads" in checks[0].message and "run.threads=4" in checks[0].message
    assert "(4 usable here)" in checks[1].message


def test_cpu_check_without_load_average_or_torch():
    no_torch = {"ok": False, "returncode": 1, "error": "No module named 'torch'"}
    cpu = {"machine": 4, "usable": 4, "load": None}
    assert diagnosis.diagnose_cpu(facts(cpu=cpu, torch=no_torch)) == []


def test_probe_cpu_reads_affinity_and_load(monkeypatch):
    monkeypatch.setattr(doctor.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    monkeypatch.setattr(doctor.os, "cpu_count", lambda: 8)
    assert doctor.probe_cpu() == {"machine": 8, "usable": 2, "load": 5.0}


def test_old_python_and_system_interpreter():
    py = {"version": "3.9.18", "requires": [3, 10], "env": None, "executable": "/usr/bin/python3"}
    checks = diagnosis.diagnose_python(facts(python=py))
    assert statuses(checks) == ["FAIL", "warn"] and "/usr/bin/python3" in checks[1].message


def test_missing_dependency_warns_and_missing_package_fails():
    imports = {**HEALTHY["imports"], "tensorboard": (False, "ModuleNotFoundError: x")}
    imports["mypkg"] = (False, "ModuleNotFoundError: No module named 'mypkg'")
    checks = diagnosis.diagnose_deps(facts(imports=imports))
    assert any(c.status == "warn" and "requirements.txt" in c.message for c in checks)
    assert "pip install -e ." in failures(checks)[0]


NOT_THERE = (False, "ModuleNotFoundError: No module named 'torchvision'")


@pytest.mark.parametrize(
    "torchvision, timm, expected",
    [
        (NOT_THERE, NOT_THERE, []),  # the zoo is optional: nothing to say
        ((True, "0.28.0+cu128"), NOT_THERE, ["ok"]),
        ((True, "0.29.1"), NOT_THERE, ["FAIL"]),  # built for torch 2.14, not 2.13
        ((False, "RuntimeError: operator torchvision::nms does not exist"), NOT_THERE, ["FAIL"]),
        ((True, "0.28.0"), (False, "ImportError: cannot import name 'x'"), ["ok", "warn"]),
    ],
)
def test_the_torch_torchvision_pair_is_checked_with_the_one_command_that_fixes_it(
    torchvision, timm, expected
):
    imports = {**HEALTHY["imports"], "torchvision": torchvision, "timm": timm}
    checks = diagnosis.diagnose_zoo(facts(imports=imports))
    assert statuses(checks) == expected
    for message in failures(checks):
        assert "pip install 'torch==2.13.0 torchvision==0.28.*'" in message


def test_parse_nvidia_smi():
    query = "570.86.15, NVIDIA H100 80GB HBM3, 81559 MiB\n" * 2
    header = "| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8     |"
    smi = doctor.parse_smi(query, header)
    assert smi["driver"] == "570.86.15" and smi["cuda"] == "12.8" and len(smi["gpus"]) == 2


def test_probe_torch_catches_a_failing_import(tmp_path, monkeypatch):
    (tmp_path / "torch").mkdir()
    error = "libc10_cuda.so: cannot open shared object file: No such file or directory"
    (tmp_path / "torch" / "__init__.py").write_text(f"raise ImportError({error!r})")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    torch = doctor.probe_torch()
    assert not torch["ok"] and torch["returncode"] == 1
    assert torch["error"].splitlines()[-1] == f"ImportError: {error}"


@pytest.mark.skipif(sys.platform == "win32", reason="fake nvidia-smi is a shell script")
def test_probe_nvidia_smi_runs_and_parses_it(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    header = "| Driver Version: 535.183.01   CUDA Version: 12.2 |"
    query = "535.183.01, Tesla V100-SXM2-32GB, 32768 MiB"
    fake.write_text(f'#!/bin/sh\nif [ -z "$1" ]; then echo "{header}"; else echo "{query}"; fi\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    smi = doctor.probe_nvidia_smi()
    assert smi["driver"] == "535.183.01" and smi["cuda"] == "12.2"
    assert smi["gpus"] == ["Tesla V100-SXM2-32GB (32768 MiB)"]


def test_survives_a_world_where_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "run", lambda cmd, timeout: (None, "", "OSError: no python"))
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    f = doctor.gather_facts(tmp_path)  # no .cookiecutter.json, no pyproject.toml either
    assert f["package"] is None and f["smi"] == {"present": False}
    checks = doctor.diagnose(f)
    assert "crashed or hung" in failures(checks)[0]
    assert "package unchecked" in checks[-1].message


def test_rocm_build_skips_the_nvidia_checks():
    torch = {"cuda": None, "hip": "6.4", "cuda_available": True}
    checks = doctor.diagnose(facts(torch=torch, smi=NO_SMI))
    assert "FAIL" not in statuses(checks) and any("ROCm 6.4" in c.message for c in checks)


def test_its_parser_is_the_projects_and_argparse_where_the_package_does_not_import(
    monkeypatch,
):
    """The doctor runs before the install and with a broken package: its parser is then
    argparse's (the package check says what is wrong); else the project's bounded one."""
    assert doctor.parser_class().__module__.endswith("tools.cli")

    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == package:
                raise SyntaxError("a broken package")

    package = doctor.parser_class().__module__.partition(".")[0]
    for name in [m for m in sys.modules if m.partition(".")[0] == package]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    assert doctor.parser_class() is argparse.ArgumentParser


def test_main_exit_code_and_json(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gather_facts", lambda: facts(torch=CPU_TORCH))
    assert doctor.main(["--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert all(set(c) == {"status", "message"} for c in out)
    assert any(c["status"] == "FAIL" and "CPU build" in c["message"] for c in out)
    monkeypatch.setattr(doctor, "gather_facts", lambda: facts())
    assert doctor.main([]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("doctor: ")


@pytest.mark.slow
def test_real_run_in_a_throwaway_project(tmp_path):
    """The real probes on this machine, in a project whose package is a tiny stand-in."""
    (tmp_path / "scripts").mkdir()
    for name in ("doctor.py", "doctor_checks.py"):
        shutil.copy(SCRIPT.with_name(name), tmp_path / "scripts" / name)
    (tmp_path / ".cookiecutter.json").write_text(json.dumps({"package_name": "doctorpkg"}))
    (tmp_path / "site" / "doctorpkg").mkdir(parents=True)
    (tmp_path / "site" / "doctorpkg" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(
        [sys.executable, "scripts/doctor.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout
    assert "[ ok ] package doctorpkg imports" in out, out + proc.stderr
    summary = out.splitlines()[-1]
    assert summary.startswith("doctor: ") and summary.endswith(" failures"), out
    # A GPU box with a broken install fails here on purpose; the message says why.
    assert proc.returncode == 0, out
