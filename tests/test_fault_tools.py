"""The fault-injection driver (benchmarks/fault_tools.py): how it judges an outcome and damages
a file, on fake outcomes, and (slow) one real case end to end: bake, prepare the CSV run,
predict, CLEAN. The project's own faults are not asserted here: the driver reports them."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fault_tools.py"

# benchmarks/ is not a package, so load the module from its path (it finds fault_cases beside).
spec = importlib.util.spec_from_file_location("fault_tools", SCRIPT)
ft = importlib.util.module_from_spec(spec)
sys.modules["fault_tools"] = ft  # its dataclasses look their module up there
spec.loader.exec_module(ft)
fc = ft.fc
ARGS = argparse.Namespace(timeout=120, slow=40)


def judge(plan, rc, out="", err="", seconds=1.0, before=None):
    return ft.judge(plan, ft.Outcome(rc, out, err, seconds), before or {}, ARGS)


def test_a_documented_refusal_is_clean_and_anything_more_is_not():
    plan = fc.Plan(["x"], (2,))
    assert judge(plan, 2, err="error: bad value; use 3\n") is None
    assert judge(plan, 2, err="warning: slow\nerror: bad\n").startswith("stderr not one error:")
    assert judge(plan, 2, err="error: " + "x" * 2000).startswith("error line too long")
    assert judge(plan, 0).startswith("exit 0 (expected 2)")
    assert judge(plan, None) == "hang: no exit in 120s"
    assert judge(plan, -15) == "killed by signal: SIGTERM"
    assert judge(plan, 2, err="terminate called after throwing\n") == "abort: terminate called"


def test_a_traceback_is_named_by_the_root_exception_not_torchruns():
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "a.py", line 1\n'
        "[rank0]: torch.distributed.checkpoint.api.CheckpointException: ranks [0]\n"
        "W1201 12:00:00 api.py:1] Sending process 12 closing signal SIGTERM\n"
        "Traceback (most recent call last):\n"
        '  File "run.py", line 9\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    reason = judge(fc.Plan(["x"], (0,)), 1, err=text)
    assert reason == "traceback: torch.distributed.checkpoint.api.CheckpointException: ranks [0]"


def test_files_kept_and_temp_files_are_checked(tmp_path):
    kept, refused = tmp_path / "best.onnx", tmp_path / "preds.csv"
    kept.write_bytes(b"old")
    refused.write_bytes(b"earlier")
    plan = fc.Plan(["x"], (0, 2), keep=[kept], keep_refused=[refused], clean=[tmp_path])
    before = {p: ft.digest(p) for p in (kept, refused)}
    refused.write_bytes(b"new")
    assert judge(plan, 0, before=before) is None  # a success may replace what --out names
    assert judge(plan, 2, err="error: no\n", before=before) == "changed: preds.csv"
    kept.unlink()
    assert judge(plan, 0, before=before) == "lost: best.onnx"
    kept.write_bytes(b"old")
    (tmp_path / ".best.onnx.tmp1x2").mkdir()
    assert judge(plan, 0, before=before) == "temp file left: .best.onnx.tmp1x2"


def test_a_timed_case_over_the_limit_is_slow():
    plan = fc.Plan(["x"], (0,), timed=True)
    assert judge(plan, 0, seconds=39) is None
    assert judge(plan, 0, seconds=75) == "slow: 75s, over 40s"


def test_damage_does_what_it_says(tmp_path):
    path = tmp_path / "metrics.csv"
    text = "epoch,step,val/loss\n1,16,0.5\n2,32,0.4\n"
    for how in ("truncated", "non-utf8", "non-numeric", "emptied", "zeroed", "deleted"):
        path.write_text(text)
        fc.damage(path, how)
        data = path.read_bytes() if path.exists() else None
        if how == "truncated":
            assert data == text.encode()[: len(text) // 2]
        elif how == "non-utf8":
            with pytest.raises(UnicodeDecodeError):
                data.decode()
        elif how == "non-numeric":
            assert data.decode().splitlines()[-1] == "2,32,abc"
        elif how == "zeroed":
            assert data == b"\0" * len(text)
        else:
            assert data == (b"" if how == "emptied" else None)


def test_reasons_that_differ_in_numbers_group_and_quick_takes_one_case_per_family():
    a = "traceback: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 131"
    b = a.replace("131", "407")
    assert ft.group(a) == ft.group(b)
    assert "'utf-8'" in ft.group(a) and "0xff" in ft.group(a)
    cases = fc.all_cases(["torchscript", "export"])
    quick = ft.select(cases, argparse.Namespace(only=None, quick=True))
    assert [c.family for c in quick] == list(dict.fromkeys(c.family for c in cases))
    assert len({c.name for c in cases}) == len(cases)
    # Each case's prepare is a function (a factory that forgets to return it gives None).
    assert [c.name for c in cases if not callable(c.prepare)] == []


@pytest.mark.slow
def test_one_case_end_to_end_is_clean(tmp_path):
    # ~30-60 s: bakes, trains the tiny CSV run, predicts on its rows.
    out = tmp_path / "faults.json"
    cmd = [sys.executable, str(SCRIPT), "--only", "control-predict-csv", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 cases, 0 failures" in done.stdout
    [res] = json.loads(out.read_text())["results"]
    assert (res["case"], res["outcome"], res["rc"]) == ("control-predict-csv", "CLEAN", 0)


TORCHRUN_REPORT = """E1201 12:00:00 123 torch/distributed/elastic/multiprocessing/api.py:1002] \
failed (exitcode: 2) local_rank: 0 (pid: 1) of binary: python
Traceback (most recent call last):
  File "run.py", line 1, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_under_torchrun_its_own_report_of_a_refusal_is_not_the_project_s_traceback():
    plan = fc.Plan(["x"], (1, 2), torchrun=True)
    assert judge(plan, 2, err="[rank0]:error: bad shard; rename it\n" + TORCHRUN_REPORT) is None
    rank_crash = "Traceback (most recent call last):\nValueError: boom\n" + TORCHRUN_REPORT
    assert judge(plan, 2, err=rank_crash).startswith("traceback: ValueError: boom")
    assert judge(plan, 2, err=TORCHRUN_REPORT).startswith("exit 2 under torchrun without")
    assert judge(plan, 1, err=TORCHRUN_REPORT).startswith("exit 1 under torchrun without")
