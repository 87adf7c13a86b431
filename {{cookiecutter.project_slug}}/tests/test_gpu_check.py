"""Tests for scripts/gpu_check.py without a GPU: the list of checks, the no-GPU exit, how a
check passes, fails, skips or times out, and a few real checks on CPU (--allow-cpu). On a CUDA
machine the script itself is the test: `make gpu-check`."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT, run_script

SCRIPT = "scripts/gpu_check.py"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # hides any GPU, so these tests mean the same everywhere
# scripts/ is not a package, so load the module from its path.
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up there
spec.loader.exec_module(gpu_check)


def table(stdout: str) -> dict[str, tuple[str, str]]:
    """The summary table's rows: check -> (result, detail)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("check "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        name, status, _seconds, detail = line.split(maxsplit=3)
        rows[name] = (status, detail)
    return rows


@pytest.mark.slow
def test_list_names_every_check_in_order():
    done = run_script(SCRIPT, "--list")
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert names == list(gpu_check.CHECKS)
    assert set(names) >= {"tests", "resume", "bf16", "fp16", "compile", "distributed"}
    assert set(names) >= {"preemption", "smoke", "benchmark"}
    # What the CPU suite cannot run: NCCL, CUDA-only options, GPUs for sweep trials.
    assert set(names) >= {"fsdp", "fsdp_bf16", "cpu_offload", "compile_ddp", "compile_fsdp"}
    assert set(names) >= {"channels_last", "init_from", "sweep_gpus"}


@pytest.mark.slow
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    done = run_script(SCRIPT, env=NO_GPU)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("no CUDA GPU visible: ") and len(done.stdout.splitlines()) == 1
    assert "--allow-cpu" in done.stdout


@pytest.mark.slow
def test_the_tests_check_runs_the_slow_tests_of_test_cuda_too():
    """pyproject's addopts deselect slow tests; the check's own -m selects them again."""
    runs = []

    class Collect:
        def python(self, *args: str) -> str:
            runs.append(run_script(*args, "--collect-only").stdout)
            return runs[-1]

    gpu_check.check_tests(Collect())
    assert "test_cuda.py::test_compiled_model_trains_and_saves_plain_keys" in runs[0]
    assert "deselected" not in runs[0]


@pytest.mark.slow
def test_unknown_check_is_refused():
    done = run_script(SCRIPT, "--allow-cpu", "--only", "smoke,nope")
    assert done.returncode == 2 and "unknown check 'nope'" in done.stderr


def test_bf16_counts_as_native_from_compute_capability_8():
    assert gpu_check.Machine("cuda", 1, (8, 0)).native_bf16
    assert gpu_check.Machine("cuda", 1, (9, 0)).native_bf16
    assert not gpu_check.Machine("cuda", 1, (7, 5)).native_bf16  # T4: bf16 only emulated
    assert not gpu_check.Machine("cpu", 0, None).native_bf16


def test_pytest_summary_is_the_last_result_line():
    out = "...s.\n=== short test summary info ===\nSKIPPED [1] x\n2 passed, 1 skipped in 3.1s\n"
    assert gpu_check.pytest_summary(out) == "2 passed, 1 skipped in 3.1s"


def fake_checks(monkeypatch):
    def passes(c):
        """Passes."""
        return "fine: " + c.python("-c", "print('hello')").splitlines()[-1]

    def fails(c):
        """Exits 3."""
        c.python("-c", "import sys; print('boom'); sys.exit(3)")

    def hangs(c):
        """Sleeps past its deadline."""
        c.python("-c", "import time; time.sleep(60)")

    def skips(c):
        """Skips."""
        raise gpu_check.Skipped("not here")

    checks = {"passes": passes, "fails": fails, "hangs": hangs, "skips": skips}
    monkeypatch.setattr(gpu_check, "CHECKS", checks)


@pytest.mark.slow
def test_each_outcome_reaches_the_table_and_a_failure_exits_1(monkeypatch, capsys):
    fake_checks(monkeypatch)
    assert gpu_check.main(["--allow-cpu", "--timeout", "3"]) == 1
    out = capsys.readouterr().out
    rows = table(out)
    assert rows["passes"] == ("pass", "fine: hello")
    assert rows["fails"] == ("FAIL", "exit 3 (expected 0): boom")
    assert rows["hangs"][0] == "FAIL" and rows["hangs"][1].startswith("timed out")
    assert rows["skips"] == ("skip", "not here")
    assert "    | boom" in out  # a failure shows the end of its output
    assert out.splitlines()[-1].startswith("gpu check: 1 passed, 2 failed, 1 skipped in ")


def test_no_failure_exits_0_and_keep_keeps_the_outputs(monkeypatch, capsys):
    fake_checks(monkeypatch)
    assert gpu_check.main(["--allow-cpu", "--only", "passes,skips", "--keep"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    kept = gpu_check.Path(last.split("outputs kept in ")[1])
    assert (kept / "passes" / "1.log").read_text().startswith(f"$ {sys.executable} -c")
    gpu_check.shutil.rmtree(kept)


def real_checks_on_cpu(monkeypatch, capsys, *names: str) -> tuple[dict, str]:
    """The checks `names` for real with --allow-cpu, any GPU hidden from them and from the
    commands they start; their table's rows and the output. In this process: a subprocess
    would only import torch once more (the tests above run the script itself)."""
    monkeypatch.setattr(gpu_check, "find_machine", lambda: "hidden by the test")
    for key, value in NO_GPU.items():
        monkeypatch.setenv(key, value)
    code = gpu_check.main(["--allow-cpu", "--only", ",".join(names)])
    out, err = capsys.readouterr()
    assert code == 0, out[-4000:] + err[-2000:]
    return table(out), out


@pytest.mark.slow
def test_a_few_real_checks_on_cpu(monkeypatch, capsys):
    rows, out = real_checks_on_cpu(monkeypatch, capsys, "smoke", "resume", "fp16")
    assert list(rows) == ["smoke", "resume", "fp16"]
    assert rows["smoke"][0] == "pass" and "smoke test passed" in rows["smoke"][1]
    assert rows["resume"][0] == "pass" and "bitwise equal" in rows["resume"][1]
    assert rows["fp16"] == ("skip", "fp16 autocast is checked on CUDA only")
    assert out.splitlines()[-1].startswith("gpu check: 2 passed, 0 failed, 1 skipped")


@pytest.mark.slow
def test_preemption_check_on_cpu(monkeypatch, capsys):
    """SIGTERM to train.py and its loader workers: exit 75, then a resume to the end."""
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, "preemption")
    status, detail = rows["preemption"]
    assert status == "pass" and "SIGTERM -> exit 75" in detail


@pytest.mark.slow
def test_the_fsdp_and_channels_last_checks_on_cpu(monkeypatch, capsys):
    """fsdp on gloo: one process and 2 ranks, each stopped by SIGTERM and resumed; fsdp with
    bf16 on the default CNN; channels_last under ddp and fsdp. The CUDA-only checks skip.
    (The compile checks are left to GPUs: compiling takes minutes on a busy CPU.)"""
    names = ["fsdp", "fsdp_bf16", "channels_last", "cpu_offload", "sweep_gpus"]
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, *names)
    assert list(rows) == names
    assert rows["fsdp"][0] == "pass" and rows["fsdp"][1].startswith("gloo: 1 rank(s) stopped")
    assert "; 2 rank(s) stopped at step" in rows["fsdp"][1]
    assert rows["fsdp_bf16"][0] == "pass" and rows["fsdp_bf16"][1].startswith("epoch 2/2")
    assert rows["channels_last"][0] == "pass" and "fsdp: epoch 2/2" in rows["channels_last"][1]
    assert rows["cpu_offload"][0] == "skip" and "needs CUDA GPUs" in rows["cpu_offload"][1]
    assert rows["sweep_gpus"][0] == "skip"


@pytest.mark.slow
def test_init_from_check_on_cpu(monkeypatch, capsys):
    """A run given train.init_from and train.resume=auto starts from the weights it names."""
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, "init_from")
    status, detail = rows["init_from"]
    assert status == "pass" and detail.startswith("one step from best.pt")


def test_the_combinations_check_runs_the_suite_on_cuda(monkeypatch):
    """The GPU-only combinations (fp16, NCCL) are the CPU suite's own cases on CUDA."""
    calls = []

    class Recorder:
        def python(self, *args, expect=0, env=None):
            calls.append((args, env))
            return "3 passed, 1 skipped in 9.0s"

    assert gpu_check.check_combinations(Recorder()) == "3 passed, 1 skipped in 9.0s"
    ((args, env),) = calls
    assert "tests/test_combinations.py" in args and env == {"COMBINATIONS_DEVICE": "cuda"}
    from pairwise import covering_cases

    assert any(case["amp"] == "fp16" for case in covering_cases(device="cuda"))
