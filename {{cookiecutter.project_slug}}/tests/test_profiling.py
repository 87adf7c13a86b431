"""scripts/train.py --profile: a trace TensorBoard and Perfetto open and a table of the top
operators, in a new folder of the run folder each time, never over an earlier one."""

from __future__ import annotations

import json

from conftest import tiny_run

from {{ cookiecutter.package_name }}.tools.train import train_main


def test_a_profile_writes_a_trace_and_a_table_and_a_second_one_keeps_the_first(tiny, capsys):
    run = tiny_run(tiny)
    assert train_main([*tiny, "train.epochs=1", "--profile", "2"]) == 0
    first = run / "profile"
    [trace] = first.glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    table = (first / "ops.txt").read_text()
    assert table.startswith("2 steps profiled") and "aten::" in table
    assert f"profile of 2 steps after step 3: {first}" in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    # Resumed, profiled again (longer than the run has steps left: what it profiled is kept).
    assert train_main([*tiny, "train.epochs=2", "train.resume=auto", "--profile", "50"]) == 0
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    second = run / "profile-2"
    assert list(second.glob("*.pt.trace.json")) and "aten::" in (second / "ops.txt").read_text()


def test_without_the_flag_nothing_is_profiled(tiny):
    assert train_main([*tiny, "train.epochs=1"]) == 0
    run = tiny_run(tiny)
    assert not list(run.glob("profile*"))
