"""Tests for scripts/benchmark_dataloader.py, scripts/benchmark_gpu.py and
scripts/benchmark_metrics.py: the pure helpers (worker counts, suggestion, GPU peak table,
FLOP count) and one tiny real run of each on CPU.
They check that every number comes out, never how fast: speed is measured, not asserted."""

from __future__ import annotations

import importlib.util
import json
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, ROOT, TINY, run_script

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.tasks import build_task


def load_script(name: str):
    # scripts/ is not a package, so load the module from its path.
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


loader_bench = load_script("benchmark_dataloader")
gpu_bench = load_script("benchmark_gpu")


def test_worker_counts_try_0_1_2_4_capped_by_the_cpu_count():
    assert loader_bench.worker_counts(1) == [0, 1]
    assert loader_bench.worker_counts(2) == [0, 1, 2]
    assert loader_bench.worker_counts(3) == [0, 1, 2]
    assert loader_bench.worker_counts(64) == [0, 1, 2, 4]


def test_suggestion_is_the_fewest_workers_within_10_percent_of_the_best():
    assert loader_bench.suggest({0: 1000.0, 1: 300.0, 2: 500.0}) == 0
    assert loader_bench.suggest({0: 100.0, 1: 95.0, 2: 200.0, 4: 210.0}) == 2
    assert loader_bench.suggest({0: 100.0, 2: 91.0}) == 0


@pytest.mark.slow
def test_dataloader_benchmark_measures_each_worker_count_and_suggests_one():
    args = ["--workers", "0", "1", "--batches", "3", "--warmup", "1", "--repeats", "2"]
    done = run_script("scripts/benchmark_dataloader.py", *TINY, *args, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = result["results"]
    assert [r["num_workers"] for r in rows] == [0, 1]
    for r in rows:
        assert r["batches_per_s"] > 0 and r["first_batch_s"] >= 0
        assert len(r["all_batches_per_s"]) == 2
        assert r["samples_per_s"] == pytest.approx(r["batches_per_s"] * 16)
    assert result["suggested_num_workers"] in (0, 1)


@pytest.mark.slow
def test_dataloader_benchmark_prints_a_table_and_the_suggestion():
    done = run_script("scripts/benchmark_dataloader.py", *TINY, "--workers", "0", "--batches", "2")
    assert done.returncode == 0, done.stderr
    assert "num_workers=0" in done.stdout and "batches/s" in done.stdout
    assert "suggested: data.num_workers=0" in done.stdout


def test_dataloader_benchmark_names_a_bad_key_in_one_line(capsys):
    assert loader_bench.main(["data.nme=x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown config key 'data.nme' (did you mean 'data.name'?)"


@pytest.mark.slow
def test_dataloader_benchmark_reads_the_image_folder_example_with_workers(demo_data, capsys):
    config = str(CONFIGS / "experiments" / "image_folder.yaml")
    args = ["--config", config, "--workers", "0", "1", "--batches", "2", "--repeats", "1"]
    assert loader_bench.main([*args, "--json"]) == 0  # in-process: faster
    result = json.loads(capsys.readouterr().out)
    assert result["dataset"] == "image_folder" and result["configured_num_workers"] == 2
    assert [r["num_workers"] for r in result["results"]] == [0, 1]
    assert all(r["samples_per_s"] > 0 for r in result["results"])


def test_known_gpus_map_to_their_peak_and_specific_names_win():
    assert gpu_bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_bench.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_bench.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_bench.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu_bench.peak_tflops("NVIDIA L40S") == 362.0  # not the L4's
    assert gpu_bench.peak_tflops("NVIDIA L4") == 121.0
    assert gpu_bench.peak_tflops("NVIDIA GeForce RTX 4090") == 165.2
    assert gpu_bench.peak_tflops("NVIDIA GeForce RTX 4090 Laptop GPU") is None
    assert gpu_bench.peak_tflops("NVIDIA Tesla T4") is None
    assert gpu_bench.peak_tflops("cpu") is None


def test_peak_table_matches_whole_names_only():
    """A key inside a longer word is another GPU: the L40 is not an L4 (whose peak made its
    MFU 1.5x too high), an RTX A1000 is not an A100, an H1000 nothing in the table."""
    assert gpu_bench.peak_tflops("NVIDIA L40") == 181.0
    assert gpu_bench.peak_tflops("NVIDIA RTX A1000") is None
    assert gpu_bench.peak_tflops("NVIDIA H1000") is None
    assert gpu_bench.peak_tflops("NVIDIA H200 NVL") == 835.0
    assert gpu_bench.peak_tflops("NVIDIA GH200 480GB") == 989.0


def test_flop_count_is_the_matmul_count_and_scales_with_the_batch():
    cfg = load_config(None, ["model.name=mlp", "model.width=16", "model.depth=1"])
    x, y = torch.randn(8, 1, 2, 2), torch.randint(3, (8,))
    model = build_model(cfg.model, x[:2], 3)  # Linear 4 -> 16, Linear 16 -> 3
    task = build_task(cfg.task, SimpleNamespace(num_classes=3))
    forward = 2 * 8 * (4 * 16 + 16 * 3)
    # backward: weight gradients of both layers (= forward) + the hidden layer's input gradient
    backward = forward + 2 * 8 * 16 * 3
    assert gpu_bench.count_flops(model, task, x, y) == forward + backward
    assert all(p.grad is None for p in model.parameters())
    double = gpu_bench.count_flops(model, task, torch.cat([x, x]), torch.cat([y, y]))
    assert double == 2 * (forward + backward)


@pytest.mark.slow
def test_gpu_benchmark_runs_fp32_and_bf16_on_cpu_with_mfu_not_available():
    args = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--compile", "off", "--json"]
    done = run_script("scripts/benchmark_gpu.py", *TINY, *args)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["device"] == "cpu" and result["peak_bf16_tflops"] is None
    rows = {r["dtype"]: r for r in result["results"]}
    assert set(rows) == {"fp32", "bf16"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["samples_per_s"] > 0 and r["ms_per_step"] > 0 and r["tflops"] > 0
        assert r["flops_per_step"] > 0 and r["mfu"] is None and r["peak_memory_mb"] is None
    assert rows["fp32"]["flops_per_step"] == rows["bf16"]["flops_per_step"]


def test_gpu_benchmark_computes_mfu_from_a_given_peak_and_prints_a_table(capsys):
    args = ["--steps", "1", "--warmup", "1", "--repeats", "1", "--dtypes", "fp32"]
    assert gpu_bench.main([*TINY, *args, "--peak-tflops", "0.001"]) == 0  # in-process: faster
    out = capsys.readouterr().out
    assert out.startswith("fp32 compile off") and "GFLOP per step" in out
    assert re.search(r"MFU +[\d.]+%", out.splitlines()[0]), out


@pytest.mark.slow
def test_gpu_benchmark_compiles_on_cpu():
    args = ["--steps", "1", "--warmup", "1", "--repeats", "1", "--compile", "on", "--json"]
    done = run_script("scripts/benchmark_gpu.py", *TINY, *args, "--dtypes", "fp32", timeout=300)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["results"]
    assert row["compile"] is True and "error" not in row, row
    assert row["samples_per_s"] > 0


@pytest.mark.slow
def test_metrics_benchmark_times_an_epoch_and_the_validation_metrics_of_each_case():
    args = ["--rows", "3000", "--steps", "2", "--repeats", "1", "--json", "run.device=cpu"]
    done = run_script("scripts/benchmark_metrics.py", *args, "train.batch_size=16")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"]
    # The CNN's classes; the table's two; the multi-label table's 8 labels
    assert [r["classes"] for r in rows] == [10, 2, 8]
    for r in rows:
        assert r["epoch_s"] > 0 and r["metrics_s"] > 0 and r["baseline_s"] > 0
        assert r["all_share"] == pytest.approx(r["metrics_s"] / r["epoch_s"])
