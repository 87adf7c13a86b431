"""Tests for scripts/gpu_check.py without a GPU: the list, the no-GPU exit, how a check
passes, fails, skips, times out or is stopped by SIGTERM, the JSON report and --resume, that
every CUDA path of the package is named by a check, and (slow) every check that runs on CPU,
for real with --allow-cpu. On a CUDA machine the script itself is the test: make gpu-check."""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace  # feature: fsdp

import pytest
import torch
from conftest import ROOT, load_script, run_script

import {{ cookiecutter.package_name }} as package
from {{ cookiecutter.package_name }} import distributed
from {{ cookiecutter.package_name }}.errors import ConfigError

SCRIPT = "scripts/gpu_check.py"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # hides any GPU, so these tests mean the same everywhere
gpu_check = load_script("gpu_check")
from gpu_checks import common, registry  # noqa: E402  (importable once gpu_check is loaded)

CPU = common.Machine("cpu", 0, None)


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


def summary(stdout: str) -> str:
    """The summary line: the last before the block that ends the output (after `---`)."""
    lines = stdout.splitlines()
    return lines[lines.index("---") - 1]


def test_list_names_every_check_in_order_with_what_it_covers(capsys):
    """The quick set, then the default run's checks group by group, then the rest: each
    check once, in the order it runs, on a line of its own with its covers line under it."""
    assert gpu_check.main(["--list"]) == 0
    *lines, estimate = capsys.readouterr().out.splitlines()
    listed = [line for line in lines if line.startswith("  ")]
    names = [line.split()[0] for line in listed[::2]]
    assert all(line.split()[0] == "covers:" for line in listed[1::2])
    assert names[: len(registry.QUICK)] == [s.name for s in registry.QUICK]
    order = [s.name for s in registry.CHECKS]
    for group in range(1, len(registry.GROUPS) + 1):
        members = registry.group(str(group))
        assert members == sorted(members, key=order.index)
    assert sorted(names[len(registry.QUICK) :]) == sorted(order)
    assert estimate.startswith("A default run takes about")


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "find_machine", lambda: "torch 2.x is a CPU build")
    assert gpu_check.main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("no CUDA GPU visible: torch 2.x") and len(out.splitlines()) == 1
    assert "--allow-cpu" in out


def test_unknown_check_and_resume_without_a_report_are_refused(capsys, tmp_path):
    for argv in (["--only", "smoke,nope"], ["--resume"], ["--resume", "--json", "none.json"]):
        with pytest.raises(SystemExit) as exit:
            gpu_check.main(["--allow-cpu", *argv])
        assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "unknown check 'nope'" in err and err.count("--resume needs --json FILE") == 2


def make_gpu_check(*variables: str) -> argparse.Namespace:
    """The options `make gpu-check` (with these variables) gives the script, as it parses them."""
    line = subprocess.run(
        ["make", "-s", "-n", "gpu-check", "PYTHON=python", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = shlex.split(line)
    return gpu_check.parse(args[args.index(SCRIPT) + 1 :])


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_check_writes_the_json_report_unless_args_names_another():
    assert make_gpu_check().json == "gpu-check.json"  # in the project root
    chosen = make_gpu_check("ARGS=--json other.json --only ddp")
    assert (chosen.json, chosen.names) == ("other.json", ["ddp"])
    readme = (ROOT / "docs" / "gpu-check.md").read_text()
    assert "`make gpu-check` writes the report to `gpu-check.json`" in " ".join(readme.split())


def test_the_estimate_of_a_run_is_the_sum_the_checks_limits_imply(capsys):
    """Each limit is 3-4 times its check's expected seconds on one H200: the estimate of a
    whole run that --list prints (and docs/gpu-check.md points to) is the sum of those, of the
    checks this project has, not a figure of its own."""
    low, high = registry.expected_seconds()
    assert 0 < low < high
    assert low == sum(s.limit for s in registry.CHECKS if s.default) / 4
    assert gpu_check.main(["--list"]) == 0
    found = re.search(r"takes about (\d+) to (\d+) minutes", capsys.readouterr().out)
    assert found and tuple(map(int, found.groups())) == (round(low / 60), round(high / 60))
    readme = " ".join((ROOT / "docs" / "gpu-check.md").read_text().split())
    assert "A run takes the sum of the checks' expected seconds" in readme
    assert "scripts/gpu_check.py --list` prints last" in readme


def test_bf16_counts_as_native_from_compute_capability_8_and_on_the_cpu():
    assert common.Machine("cuda", 1, (8, 0)).native_bf16
    assert common.Machine("cuda", 1, (9, 0)).native_bf16
    assert not common.Machine("cuda", 1, (7, 5)).native_bf16  # T4: bf16 only emulated
    assert CPU.native_bf16  # CPU autocast computes bf16


def test_two_ranks_share_one_gpu_over_gloo_and_use_nccl_with_a_gpu_each(tmp_path):
    one, two = (common.Machine("cuda", n, (9, 0)) for n in (1, 2))
    assert (one.backend(2), two.backend(2), CPU.backend(2)) == ("gloo", "nccl", "gloo")
    launch, env = common.Check(one, tmp_path, 0).launch(2)
    assert "--nproc_per_node=2" in launch and env == {"DIST_BACKEND": "gloo"}
    assert common.Check(two, tmp_path, 0).launch(2)[1] == {}
    assert common.Check(CPU, tmp_path, 0).launch(2)[1] == {}
    assert common.Check(one, tmp_path, 0).launch(1) == ([sys.executable, "scripts/train.py"], {})


@pytest.mark.parametrize(
    ("variable", "backend", "serves"),
    [("gloo", "gloo", ("cuda", "cpu")), ("", "nccl", ("cuda",)), ("NCCL", "nccl", ("cuda",))],
)
def test_dist_backend_chooses_the_backend_of_cuda_ranks(monkeypatch, variable, backend, serves):
    """DIST_BACKEND=gloo, read in distributed.join only: CUDA ranks over gloo (two may share
    a GPU); NCCL otherwise. The GPU calls are recorded, not made."""
    made = []
    monkeypatch.setenv("DIST_BACKEND", variable)
    monkeypatch.setattr(distributed.torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda b, **kw: made.append(b))
    distributed.join(torch.device("cuda", 0))
    assert made == [backend] and distributed._serves == serves
    monkeypatch.setattr(distributed, "_serves", ())


def test_dist_backend_names_what_it_takes_in_one_line(monkeypatch):
    monkeypatch.setenv("DIST_BACKEND", "mpi")
    with pytest.raises(ConfigError, match="^DIST_BACKEND='mpi' is not a backend") as error:
        distributed.join(torch.device("cuda", 0))
    assert "gloo" in str(error.value) and "\n" not in str(error.value)


def test_pytest_summary_is_the_last_result_line():
    out = "...s.\n=== short test summary info ===\nSKIPPED [1] x\n2 passed, 1 skipped in 3.1s\n"
    assert common.pytest_summary(out) == "2 passed, 1 skipped in 3.1s"


def test_warning_lines_are_found_and_torchruns_own_notices_are_not(tmp_path):
    c = common.Check(CPU, tmp_path, 0)
    c.note_warnings(
        "\n".join(
            [
                "/x/torch/amp/grad_scaler.py:1: UserWarning: something deprecated",
                "[rank0]:[W1203 12:00:00.000000 ProcessGroupNCCL.cpp:1] Warning: not destroyed",
                "W1203 12:00:00.000000 9 torch/distributed/run.py:1] Setting OMP_NUM_THREADS",
                "W1203 12:00:00.000000 9 torch/distributed/elastic/agent/server/api.py:1] got 15",
                "epoch 1/2 | train loss 1.0 | val loss 1.0 acc 0.5 (best)",
                "warning: the filesystem of /x does not support file locks",  # the project's
                "/x/y.py:2: UserWarning: something deprecated",  # a second one is noted too
            ]
        ),
        "python scripts/train.py",
    )
    assert [w["line"][:20] for w in c.warnings] == [
        "/x/torch/amp/grad_sc",
        "[rank0]:[W1203 12:00",
        "warning: the filesys",
        "/x/y.py:2: UserWarni",
    ]
    assert {w["command"] for w in c.warnings} == {"python scripts/train.py"}


# ---- every CUDA path of the package is named by a check ----

# What marks a CUDA path in the package's code (docstrings and comments do not count).
CUDA_MARK = re.compile(
    r"\bcuda\b|cudnn|\bnccl\b|pin_memory|non_blocking|GradScaler|SyncBatchNorm|CPUOffloadPolicy"
)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@functools.cache
def cuda_sites() -> dict[str, set[str]]:
    """{"file.py:name": the marks found there}: each top-level function or class (its
    methods and inner functions included) or the module level of the package whose code
    names one of CUDA_MARK."""
    found: dict[str, set[str]] = {}
    root = Path(package.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, *DEFINITIONS))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        visit(tree, path.relative_to(root).as_posix(), "<module>", docstrings, found)
    return found


def visit(node: ast.AST, file: str, where: str, docstrings: set, found: dict) -> None:
    if isinstance(node, DEFINITIONS) and where == "<module>":
        where = node.name
    field = {ast.Constant: "value", ast.Attribute: "attr", ast.Name: "id", ast.alias: "name"}
    text = getattr(node, field.get(type(node), ""), None)
    if isinstance(text, str) and id(node) not in docstrings:
        found.setdefault(f"{file}:{where}", set()).update(CUDA_MARK.findall(text))
    for child in ast.iter_child_nodes(node):
        visit(child, file, where, docstrings, found)


def cuda_code() -> dict[str, set[str]]:
    return {site: marks for site, marks in cuda_sites().items() if marks}


def test_the_scan_finds_cuda_branches_and_not_docstrings():
    found = cuda_code()
    assert found["utils/device.py:configure_backends"] >= {"cuda"}
    assert "GradScaler" in found["trainer.py:build_trainee"]
    assert "SyncBatchNorm" in found["parallel.py:replica"]
    assert "CPUOffloadPolicy" in found["fsdp.py:shard"]  # feature: fsdp
    assert "utils/signals.py:<module>" not in found  # its docstring names no CUDA code


def test_every_cuda_path_of_the_package_is_named_by_a_check():
    """Each function of the package that branches on CUDA is a site of a path in
    gpu_checks/registry.CUDA_PATHS, each site exists, and each path is covered by a check
    that runs by default: a new CUDA branch fails here until a check covers it."""
    sites = {site: path for path, (_, found) in registry.CUDA_PATHS.items() for site in found}
    unnamed = sorted(set(cuda_code()) - set(sites))
    assert not unnamed, f"CUDA code no check names (add it to registry.CUDA_PATHS): {unnamed}"
    stale = sorted(set(sites) - set(cuda_sites()))  # no such file or top-level name
    assert not stale, f"registry.CUDA_PATHS names functions that do not exist: {stale}"
    covered = {p for spec in registry.CHECKS if spec.default for p in spec.covers}
    assert covered == set(registry.CUDA_PATHS), set(registry.CUDA_PATHS) ^ covered


# ---- running checks: outcomes, report, resume, SIGTERM (fake checks, in this process) ----


def fake_checks(monkeypatch, **checks) -> None:
    """These functions as the checks, each with 30 s on a GPU (x5 on the CPU), "hangs" 1 s."""
    specs = {
        name: registry.Spec(name, fn, ("device",), 0.2 if name == "hangs" else 30)
        for name, fn in checks.items()
    }
    monkeypatch.setattr(gpu_check, "SPECS", specs)
    monkeypatch.setattr(gpu_check, "CHECKS", tuple(specs.values()))


def passes(c):
    """Passes."""
    c.target("a ratio", 2.0, 1.0)
    return "fine: " + c.python("-c", "print('hello')").splitlines()[-1]


def fails(c):
    """Exits 3."""
    c.python("-c", "import sys; print('boom'); sys.exit(3)")


def hangs(c):
    """Sleeps past its deadline."""
    c.python("-c", "import time; time.sleep(60)")


def skips(c):
    """Skips."""
    raise common.Skipped("not here")


def warns(c):
    """Prints a warning."""
    return c.python("-c", "import warnings; warnings.warn('careful')")


def test_each_outcome_reaches_the_table_and_the_report(monkeypatch, capsys, tmp_path):
    fake_checks(monkeypatch, passes=passes, fails=fails, hangs=hangs, skips=skips, warns=warns)
    path = tmp_path / "report.json"
    assert gpu_check.main(["--allow-cpu", "--json", str(path)]) == 1
    out = capsys.readouterr().out
    rows = table(out)
    assert rows["passes"] == ("pass", "fine: hello")
    assert rows["fails"] == ("FAIL", "exit 3 (expected 0): boom")
    assert rows["hangs"][0] == "FAIL" and rows["hangs"][1].startswith("timed out")
    assert rows["skips"] == ("skip", "not here")
    assert rows["no_warnings"][0] == "FAIL" and "UserWarning: careful" in rows["no_warnings"][1]
    assert "    | boom" in out  # a failure shows the end of its output
    assert summary(out).startswith("gpu check: 2 passed, 3 failed, 1 skipped in ")
    report = json.loads(path.read_text())
    assert report["machine"]["device"] == "cpu" and report["versions"]["torch"]
    assert report["summary"] == {"pass": 2, "FAIL": 3, "skip": 1, "stopped": 0, "not run": 0}
    failed = report["failed"]
    assert set(failed) == {"fails", "hangs", "no_warnings"}
    assert failed["fails"][0].endswith("scripts/gpu_check.py --only fails --allow-cpu --keep")
    assert failed["fails"][1].endswith("sys.exit(3)'") and failed["fails"][1].startswith("cd ")
    assert "warnings.warn" in failed["no_warnings"][0]
    (target,) = report["targets"]
    assert target["name"] == "a ratio" and target["pass"] is None  # speed: not judged on CPU
    assert report["needs_several_gpus"]["paths"] and report["complete"]


def test_resume_keeps_what_passed_and_runs_the_rest(monkeypatch, capsys, tmp_path):
    path = str(tmp_path / "report.json")
    fake_checks(monkeypatch, passes=passes, fails=fails)
    assert gpu_check.main(["--allow-cpu", "--json", path]) == 1
    capsys.readouterr()
    again = []
    fake_checks(monkeypatch, passes=fails, fails=lambda c: again.append(1) or "fixed")
    assert gpu_check.main(["--allow-cpu", "--json", path, "--resume"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["passes"] == ("pass", "fine: hello (kept from the earlier report)")
    assert rows["fails"] == ("pass", "fixed")
    assert again == [1]  # only the failed check ran again
    checks = json.loads(Path(path).read_text())["checks"]
    assert [c.get("resumed", False) for c in checks[:2]] == [True, False]


def test_budget_leaves_out_the_checks_it_has_no_time_for(monkeypatch, capsys):
    fake_checks(monkeypatch, passes=passes, skips=skips)
    assert gpu_check.main(["--allow-cpu", "--budget", "1"]) == 3
    rows = table(capsys.readouterr().out)
    assert rows["passes"] == ("not-run", "--budget spent") == rows["skips"]


def sleeps(c):
    """Sleeps well inside its own limit (30 s, x5 on the CPU)."""
    c.python("-c", "import time; time.sleep(60)")


def test_a_check_the_budget_ends_is_not_run_and_one_its_own_limit_ends_fails(
    monkeypatch, capsys, tmp_path
):
    """A check that starts with the budget nearly spent is stopped at the budget's end: not
    run (exit 3, rerun with --resume), not a failure; --timeout's stop is still one."""
    fake_checks(monkeypatch, sleeps=sleeps, passes=passes)
    path = tmp_path / "report.json"
    assert gpu_check.main(["--allow-cpu", "--budget", "6", "--json", str(path)]) == 3
    rows = table(capsys.readouterr().out)
    assert rows["sleeps"][0] == "not-run" and rows["sleeps"][1].startswith("--budget spent")
    assert rows["passes"] == ("not-run", "--budget spent")
    report = json.loads(path.read_text())
    assert report["summary"]["FAIL"] == 0 and not report["failed"] and not report["complete"]
    fake_checks(monkeypatch, hangs=hangs)
    assert gpu_check.main(["--allow-cpu", "--budget", "60"]) == 1
    status, detail = table(capsys.readouterr().out)["hangs"]
    assert status == "FAIL" and detail.startswith("timed out (see --timeout)")


def test_sigterm_stops_the_check_and_its_processes_and_writes_the_report(
    monkeypatch, capsys, tmp_path
):
    children = []

    def stopped_midway(c):
        """Starts a process, then this process gets SIGTERM (as from a scheduler)."""
        children.append(c.start(sys.executable, "-c", "import time; time.sleep(60)"))
        os.kill(os.getpid(), signal.SIGTERM)
        c.wait(children[0])

    fake_checks(monkeypatch, passes=passes, stopped_midway=stopped_midway, skips=skips)
    path = tmp_path / "report.json"
    assert gpu_check.main(["--allow-cpu", "--json", str(path)]) == 75
    assert children[0].returncode == -signal.SIGKILL  # killed with its group, and reaped
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again
    report = json.loads(path.read_text())
    statuses = [c["status"] for c in report["checks"]]
    assert statuses == ["pass", "stopped", "not run", "pass"]  # the last: no_warnings
    assert report["stopped"] == "SIGTERM" and not report["complete"]
    assert "rerun with --json FILE --resume" in summary(capsys.readouterr().out)


def test_the_combinations_check_runs_the_suite_on_the_gpu_ranks_sharing_it(tmp_path):
    calls = []

    class Recorder(common.Check):
        def python(self, *args, expect=0, env=None):
            calls.append((args, env))
            return "3 passed, 1 skipped in 9.0s"

    one_gpu = Recorder(common.Machine("cuda", 1, (9, 0)), tmp_path, 0)
    assert registry.paths.check_combinations(one_gpu) == "3 passed, 1 skipped in 9.0s"
    ((args, env),) = calls
    assert "tests/test_combinations.py" in args
    assert env == {"COMBINATIONS_DEVICE": "cuda", "DIST_BACKEND": "gloo"}


# >>> sweeps
def test_the_sweep_check_wants_its_trials_on_different_gpus_where_there_are_two():
    out = "\n".join(
        [
            "sweep /x/sweep: 2 trials, 2 to run, 2 at a time",
            "t00-lr1e-3: started (train.lr=1e-3) on GPU 0 log /x/t00-lr1e-3.out",
            "t01-lr2e-3: started (train.lr=2e-3) on GPU 1 log /x/t01-lr2e-3.out",
        ]
    )
    trials, judge = ["t00-lr1e-3", "t01-lr2e-3"], registry.paths.judge_trial_gpus
    gpus = registry.paths.trial_gpus(out)
    assert gpus == dict(zip(trials, ["0", "1"], strict=True))
    assert judge(gpus, trials, 2) == "2 trials at a time on GPUs 0, 1: a GPU each"
    assert judge(gpus, trials, 8) == "2 trials at a time on GPUs 0, 1: a GPU each"
    same = dict.fromkeys(trials, "0")
    assert judge(same, trials, 1) == "2 trials at a time, both on GPU 0 (one GPU here)"
    with pytest.raises(common.Failed, match="all on GPU 0 with 2 GPUs"):
        judge(same, trials, 2)
    cpu = out.replace(" on GPU 0", "").replace(" on GPU 1", "")  # CPU slots: no GPU counted
    with pytest.raises(common.Failed, match="started t00-lr1e-3 on no GPU"):
        judge(registry.paths.trial_gpus(cpu), trials, 2)
# <<< sweeps


# >>> fsdp
def test_each_fsdp_run_reports_the_start_up_line_of_its_own_log(tmp_path):
    """fsdp1's and fsdp2's start-up peaks come from the first log of that run, not from
    whichever log of the check printed such a line first."""
    c = common.Check(CPU, tmp_path, 0)
    line = "start-up peak memory per rank (building and sharding the model): "
    for n, (run, peaks) in enumerate([("fsdp1", "rank 0 +9 MB"), ("fsdp2", "rank 0 +6 MB")]):
        log, command = tmp_path / f"{n + 1}.log", f"python scripts/train.py run.name={run}"
        log.write_text(f"$ {command}\nepoch 1/2\n{line}{peaks}\n")
        c.started.append(SimpleNamespace(log=log, command=command))
    assert registry.ranks.start_up_memory(c, "fsdp2") == "rank 0 +6 MB"
    assert registry.ranks.start_up_memory(c, "fsdp1") == "rank 0 +9 MB"
    with pytest.raises(common.Failed, match="fsdp3 printed no start-up peak memory"):
        registry.ranks.start_up_memory(c, "fsdp3")
# <<< fsdp


@pytest.mark.slow
def test_the_tests_check_selects_the_tests_marked_cuda_the_slow_ones_too():
    """pyproject's addopts deselect slow tests; -m cuda on the command line replaces that."""
    done = run_script("-m", "pytest", "--collect-only", "-q", "-m", "cuda", "tests/test_cuda.py")
    assert "test_cuda.py::test_compiled_model_trains_and_saves_plain_keys" in done.stdout
    assert "test_cuda.py::test_trains_on_cuda_with_each_amp_mode[fp16]" in done.stdout


@pytest.mark.slow
def test_the_syncbn_ranks_see_unsynchronised_statistics(tmp_path):
    """The syncbn check's two ranks under torchrun, on the CPU: there each normalises its half
    with plain BatchNorm (the CPU has no SyncBatchNorm), which the comparison must catch."""
    result = tmp_path / "syncbn.json"
    ranks = [*common.TORCHRUN, "--nproc_per_node=2", "-m", "gpu_checks.numerics", "syncbn"]
    common.Check(CPU, tmp_path, float("inf")).run(*ranks, str(result), "cpu")
    done = json.loads(result.read_text())
    assert done["ranks"] == 2 and set(done["diffs"]) >= {"output", "weight grad", "running var"}
    assert done["diffs"]["output"] > 100 * registry.numerics.SYNCBN_TOLERANCE
    assert done["diffs"]["bias grad"] < registry.numerics.SYNCBN_TOLERANCE  # a sum: no stats


# ---- every check that runs on CPU, for real (--allow-cpu) ----

# Every check of the default run, in groups the slow layer runs side by side (each about a
# minute on a busy 2-core machine).
ON_CPU = {
    "measures": ["default_run", "numerics", "speed_lm", "speed_cnn"],
    "resumes": ["resume", "smoke", "distributed"],
    "signals": ["ddp", "preemption"],
    "fsdp": ["fsdp", "fsdp_bf16"],  # feature: fsdp
    "more": ["channels_last", "init_from", "profile"],
}
GPU_ONLY = ["tests", "syncbn", "compile", "compile_ddp", "out_of_memory"]
GPU_ONLY += ["cpu_offload", "compile_fsdp"]  # feature: fsdp
GPU_ONLY += ["sweep_gpus"]  # feature: sweeps
# >>> pretrained
# Skipped here without the [vision] and [hf] extras; what it runs, tests/test_zoo.py,
# test_hf.py and the pairwise suite's pretrained cases run on the CPU with them.
GPU_ONLY += ["pretrained"]
# <<< pretrained


def test_the_cpu_groups_hold_every_check_of_the_default_run():
    names = [n for group in ON_CPU.values() for n in group] + GPU_ONLY
    assert sorted(names) == sorted(s.name for s in registry.CHECKS if s.default)


def real_checks_on_cpu(monkeypatch, capsys, tmp_path, *names: str) -> tuple[dict, dict]:
    """The checks `names` for real with --allow-cpu, any GPU hidden from them and from the
    commands they start; their table's rows and the JSON report. gpu_check runs in this
    process (its checks start the processes they start on a GPU)."""
    monkeypatch.setattr(gpu_check, "find_machine", lambda: "hidden by the test")
    for key, value in NO_GPU.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "report.json"
    code = gpu_check.main(["--allow-cpu", "--only", ",".join(names), "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, out[-4000:] + err[-2000:]
    return table(out), json.loads(path.read_text())


@pytest.mark.slow
def test_measuring_checks_on_cpu(monkeypatch, capsys, tmp_path):
    names = ON_CPU["measures"]
    rows, report = real_checks_on_cpu(monkeypatch, capsys, tmp_path, *names)
    assert [r for r in rows if rows[r][0] == "pass"] == [*names, "no_warnings"], rows
    assert rows["default_run"][1].startswith("epoch 1/1")
    assert "fp32 trace cpu vs cpu" in rows["numerics"][1]
    assert "fp16: CUDA only" in rows["numerics"][1]
    judged = [t for t in report["targets"] if t["pass"] is not None]
    assert {t["check"] for t in judged} == {"numerics"} and all(t["pass"] for t in judged)
    speed = {t["name"] for t in report["targets"] if t["check"].startswith("speed")}
    assert {"LM bf16 vs TF32 steps/s", "CNN trainer vs plain loop samples/s"} <= speed
    assert report["machine"]["device"] == "cpu" and report["complete"]


@pytest.mark.slow
def test_resuming_checks_on_cpu(monkeypatch, capsys, tmp_path):
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, tmp_path, *ON_CPU["resumes"])
    assert all(rows[n][0] == "pass" for n in ON_CPU["resumes"]), rows
    assert "bitwise equal" in rows["resume"][1] and "smoke test passed" in rows["smoke"][1]
    assert rows["distributed"][1] == "1 rank(s) on gloo: world size 1 in last.pt"


@pytest.mark.slow
def test_stopping_checks_on_cpu(monkeypatch, capsys, tmp_path):
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, tmp_path, *ON_CPU["signals"])
    assert all(rows[n][0] == "pass" for n in ON_CPU["signals"]), rows
    assert rows["ddp"][1].startswith("2 rank(s) on gloo: accumulation 2; SIGTERM at step")
    assert "SIGTERM -> exit 75" in rows["preemption"][1]


# >>> fsdp
@pytest.mark.slow
def test_fsdp_checks_on_cpu(monkeypatch, capsys, tmp_path):
    rows, report = real_checks_on_cpu(monkeypatch, capsys, tmp_path, *ON_CPU["fsdp"])
    assert all(rows[n][0] == "pass" for n in ON_CPU["fsdp"]), rows
    assert rows["fsdp"][1].startswith("2 rank(s) on gloo stopped at step")
    assert rows["fsdp"][1].endswith("from 2-rank ddp's"), rows["fsdp"]  # weights compared
    (target,) = [t for t in report["targets"] if t["check"] == "fsdp"]
    assert target["pass"] and 0 <= target["value"] <= registry.ranks.FSDP_TOLERANCE
    assert rows["fsdp_bf16"][1].startswith("epoch 2/2")
# <<< fsdp


@pytest.mark.slow
def test_more_checks_on_cpu_and_the_gpu_only_ones_skip(monkeypatch, capsys, tmp_path):
    names = [*ON_CPU["more"], *GPU_ONLY]
    rows, _ = real_checks_on_cpu(monkeypatch, capsys, tmp_path, *names)
    assert all(rows[n][0] == "pass" for n in ON_CPU["more"]), rows
    assert all(rows[n][0] == "skip" for n in GPU_ONLY), rows
    assert "fsdp: epoch 2/2" in rows["channels_last"][1]  # feature: fsdp
    assert "ddp: epoch 2/2" in rows["channels_last"][1]
    assert rows["init_from"][1].startswith("one step from best.pt")
    assert "needs CUDA GPUs" in rows["cpu_offload"][1]  # feature: fsdp
