"""The training-loop benchmark (benchmarks/bench_training.py): its arithmetic and noise
handling on fake data, and (slow) the real thing in its --quick form (bakes, runs each loop
in a process). Performance targets are never asserted here: they are measured, and the
numbers go in benchmarks/README.md."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]
SCRIPT = TEMPLATE / "benchmarks" / "bench_training.py"
HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None

# benchmarks/ is not a package, so load the module from its path.
spec = importlib.util.spec_from_file_location("bench_training", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def fake_raw(stamps, steps_per_epoch, excluded=(), batch=10):
    marks = {"torch_imported": 101.0, "imports_done": 101.5, "first_step": 102.0, "threads": 2}
    return {
        "stamps": stamps,
        "batch_size": batch,
        "steps_per_epoch": steps_per_epoch,
        "excluded": [list(e) for e in excluded],
        "marks": marks,
    }


def test_steady_state_leaves_out_the_warmup_epoch_and_the_cut_spans():
    # Epoch 1 (steps 0-3) is slow warm-up; then 0.1 s per step, plus a 5 s validation that
    # sits between step 5 and step 6 and is cut out.
    stamps = [0.0, 3.0, 6.0, 9.0, 9.1, 9.2, 14.3, 14.4]
    row = bench.steady_state(fake_raw(stamps, 4, excluded=[(9.25, 14.25)]), 1, start=100.0)
    assert row["ms_per_step"] == pytest.approx(100.0)
    assert row["samples_per_s"] == pytest.approx(100.0)  # 10 samples per 0.1 s
    assert row["excluded_s"] == pytest.approx(5.0)
    assert row["start_to_first_step_s"] == pytest.approx(2.0)
    assert row["start_to_imports_s"] == pytest.approx(1.5)
    assert row["threads"] == 2


def test_steady_state_refuses_a_run_with_nothing_after_warmup():
    with pytest.raises(RuntimeError, match="none to time"):
        bench.steady_state(fake_raw([0.0, 1.0, 2.0, 3.0, 4.0], 4), 1, start=0.0)


def test_noise_reruns_a_noisy_run_and_keeps_the_quietest():
    seen = iter([0.5, 0.3, 0.35])
    noise = bench.Noise(threshold=0.1, retries=2, max_wait=0)
    row = noise.run(lambda: {"interference": next(seen)})
    assert row["interference"] == 0.3 and noise.retried == 2

    quiet = bench.Noise(threshold=0.1, retries=2, max_wait=0)
    calls = []
    assert quiet.run(lambda: calls.append(1) or {"interference": 0.05})["interference"] == 0.05
    assert len(calls) == 1 and quiet.retried == 0


def fake_runs(a, b, c):
    def rows(rates, first_step):
        return [
            {
                "samples_per_s": r,
                "ms_per_step": 1.0,
                "start_to_imports_s": 1.0,
                "start_to_first_step_s": first_step,
                "excluded_s": 0.0,
                "threads": 2,
                "interference": 0.0,
            }
            for r in rates
        ]

    torch_ref = [{"start_to_first_step_s": 1.0, "interference": 0.0}] * len(a)
    return {
        "import torch": torch_ref,
        "import torch, torch._dynamo": torch_ref,
        "minimal": rows(a, 2.0),
        "project": rows(b, 1.5),
        "lightning": rows(c, 4.0),
    }


def test_ratios_are_paired_per_repeat_then_the_median():
    # Repeat 1 ran while the machine was busy: both loops slowed down together. Ratios of
    # medians would say 0.5; the paired ratios say 0.99.
    runs = fake_runs(a=[100, 50, 100], b=[50, 49.5, 99], c=[40, 20, 40])
    res = bench.summarize(runs, ["minimal", "project", "lightning"])
    assert res["ratios"]["b/a"] == pytest.approx(0.99)
    assert res["ratios"]["b/c"] == pytest.approx(2.475)
    assert res["startup_over_import_torch_s"]["project"] == pytest.approx(0.5)
    assert res["loops"]["project"]["samples_per_s"] == 50


def test_report_shows_every_loop_every_ratio_and_the_verdicts():
    runs = fake_runs(a=[100, 100, 100], b=[99, 99, 99], c=[50, 50, 50])
    res = bench.summarize(runs, ["minimal", "project", "lightning"])
    res["setup"] = {
        "machine": bench.machine(),
        "threads": 2,
        "overrides": ["run.device=cpu"],
        "epochs": 4,
        "warmup_epochs": 1,
        "repeats": 3,
        "noise_threshold": 0.1,
        "retried_runs": 0,
        "loadavg_before": None,
        "loadavg_after": None,
        "batch_size": 64,
        "steps_per_epoch": 64,
    }
    text = bench.report(res)
    for label in bench.LABELS.values():
        if "default AdamW" not in label:
            assert f"| {label} | " in text
    assert "b/a = 0.990 (target >= 0.98: met)" in text
    assert "b/c = 1.980 (target >= 1.2: met)" in text
    assert "first step +0.50 s after `import torch` (target <= 1 s: met)" in text
    assert "first step -0.50 s after the minimal loop's (target <= 0.5 s: met)" in text
    assert '`python -c "import torch"` (reference)' in text


@pytest.mark.slow  # ~12-25 s: a bake, two reference imports, three training processes
def test_quick_benchmark_bakes_runs_every_loop_and_reports_every_number(tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads(out.read_text())
    loops = {"minimal", "project"} | ({"lightning"} if HAS_LIGHTNING else set())
    assert set(res["loops"]) == loops
    for name, row in res["loops"].items():
        assert row["samples_per_s"] > 0 and row["ms_per_step"] > 0, name
        assert 0 < row["start_to_imports_s"] < row["start_to_first_step_s"], name
        assert row["threads"] == res["setup"]["threads"], name  # same threads for all
    assert res["loops"]["project"]["validation_cut_s"] > 0  # (b) validates; cut out
    assert set(res["ratios"]) == {"b/a"} | ({"b/c"} if HAS_LIGHTNING else set())
    assert all(v > 0 for v in res["ratios"].values())
    assert set(res["references"]) == {"import torch", "import torch, torch._dynamo"}
    assert all(v > 0 for v in res["references"].values())
    assert set(res["startup_over_import_torch_s"]) == loops
    assert isinstance(res["startup_over_minimal_s"], float)
    assert res["setup"]["machine"]["torch"] and res["setup"]["repeats"] == 1
    assert "| (b) baked project trainer |" in done.stdout and "b/a = " in done.stdout


def quick_run(script: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """benchmarks/`script` --quick --json: the finished process and the numbers it wrote."""
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(TEMPLATE / "benchmarks" / script), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(out.read_text())


@pytest.mark.slow
def test_runs_benchmark_quick_gives_both_ratios(tmp_path):
    """benchmarks/bench_runs.py --quick (issue 31's figures): one pair of each, the tiny run
    against the hand-written loop and the sweep against sequential train.py processes."""
    done, result = quick_run("bench_runs.py", tmp_path)
    assert result["tiny_run_ratio"] > 0 and result["sweep_ratio"] > 0
    assert result["epoch_ratio"] > 0
    (pair,) = result["pairs"]["sweep"]
    assert pair["sweep_s"] > 0 and pair["sequential_s"] > 0
    assert "sweep of 4 / 4 train.py processes" in done.stdout


def test_option_ratios_are_each_variant_over_off_per_pair_then_the_median():
    path = SCRIPT.parent / "bench_options.py"
    spec = importlib.util.spec_from_file_location("bench_options", path)
    bench_options = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_options)
    pairs = [{"off": 2.0, "ema": 3.0, "skip": 2.0}, {"off": 1.0, "ema": 1.0, "skip": 4.0}]
    pairs.append({"off": 4.0, "ema": 5.0, "skip": 4.0})
    assert bench_options.ratios(pairs) == {"ema": 1.25, "skip": 1.0}


@pytest.mark.slow
def test_options_benchmark_quick_times_every_option(tmp_path):
    """benchmarks/bench_options.py --quick (issue 44's figures): one pair, every option on and
    off, each an epoch's seconds from two whole processes."""
    done, result = quick_run("bench_options.py", tmp_path)
    assert set(result["ratios"]) == {"ema", "skip", "micro_auto", "micro_half"}
    # One pair of tiny runs says it runs, not what it costs: a ratio of noise, any sign.
    assert all(math.isfinite(r) for r in result["ratios"].values())
    assert all(len(pair) == 5 for pair in result["pairs"])
    assert "epoch micro_half / off" in done.stdout


@pytest.mark.slow
def test_the_whole_config_stays_in_the_recipe_and_the_run_s_record(tmp_path):
    """benchmarks/config_reach.py (issue 46): traced new and resumed runs. The whole Config
    reaches the recipe (trainer.py) and what describes the whole run (the summary, the
    provenance record, the resume's check of changed settings); every other component gets
    its own section or values by name."""
    out = tmp_path / "reach.json"
    done = subprocess.run(
        [sys.executable, str(TEMPLATE / "benchmarks" / "config_reach.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    whole_run = {"trainer.py", "summary.py", "utils/provenance.py", "checkpoint/resume.py"}
    for label in ("new run", "resumed run"):
        modules = set(result[label]["modules"])
        assert "trainer.py" in modules, result[label]  # the tracer sees fit(cfg)
        assert modules <= whole_run, modules - whole_run
    assert "checkpoint/resume.py" in result["resumed run"]["modules"]  # resume.changes(cfg)
