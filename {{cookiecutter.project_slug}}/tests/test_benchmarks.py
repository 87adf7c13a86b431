"""Tests for scripts/benchmark_dataloader.py and scripts/benchmark_metrics.py: the pure helpers
(worker counts, suggestion) and one tiny real run of each on CPU.
They check that every number comes out, never how fast: speed is measured, not asserted."""

from __future__ import annotations

import json

import pytest
from conftest import CONFIGS, TINY, load_script, run_script

loader_bench = load_script("benchmark_dataloader")


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
def test_dataloader_benchmark_reads_an_example_with_workers(demo_data, capsys):
    config = str(CONFIGS / "experiments" / "image_folder.yaml")  # feature: images
    config = str(CONFIGS / "experiments" / "csv_regression.yaml")  # feature: !images
    args = ["--config", config, "--workers", "0", "1", "--batches", "2", "--repeats", "1"]
    assert loader_bench.main([*args, "--json"]) == 0  # in-process: faster
    result = json.loads(capsys.readouterr().out)
    assert result["dataset"] == "image_folder" and result["configured_num_workers"] == 2  # feature: images
    assert result["dataset"] == "csv" and result["configured_num_workers"] == 0  # feature: !images
    assert [r["num_workers"] for r in result["results"]] == [0, 1]
    assert all(r["samples_per_s"] > 0 for r in result["results"])


@pytest.mark.slow
def test_metrics_benchmark_times_an_epoch_and_the_validation_metrics_of_each_case():
    args = ["--rows", "3000", "--steps", "2", "--repeats", "1", "--json", "run.device=cpu"]
    done = run_script("scripts/benchmark_metrics.py", *args, "train.batch_size=16")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"]
    # The CNN's classes; the table's two; the multi-label table's 8 labels # feature: multilabel
    assert [r["classes"] for r in rows] == [10, 2, 8]  # feature: multilabel
    assert [r["classes"] for r in rows] == [10, 2]  # the CNN's classes; the table's two # feature: !multilabel
    for r in rows:
        assert r["epoch_s"] > 0 and r["metrics_s"] > 0 and r["baseline_s"] > 0
        assert r["all_share"] == pytest.approx(r["metrics_s"] / r["epoch_s"])
