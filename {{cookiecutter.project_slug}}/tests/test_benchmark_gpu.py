"""Tests for scripts/benchmark_gpu.py: the GPU peak table and the FLOP count, and tiny real
runs on CPU. They check that every number comes out, never how fast."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY, load_script, run_script

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.tasks import build_task

gpu_bench = load_script("benchmark_gpu")


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
