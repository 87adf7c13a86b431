"""Stored loss traces: --export-goldens FILE writes the per-step losses quick_trace observed on
this device to FILE under a key of the GPU's name, torch's and CUDA's versions (other keys
kept); --goldens FILE compares a later run's trace with the golden of its own key only. A
golden of another key is reported, never failed: other GPUs and versions are not expected to
give the same numbers (torchtitan regenerated its loss file 13 times in 8 months), which the
checks against the CPU, a second run and one process do not need.

{"format": 1, "goldens": {"NVIDIA H200 | torch 2.11.0+cu128 | CUDA 12.8":
    {"losses": [...], "settings": [...], "written": "2026-12-08T10:00:00+0000"}}}
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

from .common import Check, Machine

SOURCE = "quick_trace"  # the check whose run the goldens hold
FORMAT = 1
# The same GPU, torch and CUDA with deterministic kernels repeat a trace bit for bit; fp32
# rounding is left room for (a loss is ~1).
GOLDEN_TOLERANCE = 1e-6


def key(machine: Machine) -> str:
    return f"{machine.name} | torch {torch.__version__} | CUDA {torch.version.cuda}"


def read(path: str) -> dict | str:
    """FILE's goldens by key, or why it is no goldens file (one line)."""
    try:
        found = json.loads(Path(path).read_text())
        goldens = found["goldens"] if found.get("format") == FORMAT else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
        return f"{path} is not a goldens file ({type(exc).__name__}: {exc})"
    if not isinstance(goldens, dict):
        return f"{path} is not a goldens file of format {FORMAT}"
    return goldens


def observed(results: list[dict]) -> dict | None:
    """The trace of this run's quick_trace if it passed (the numbers a golden holds)."""
    for r in results:
        if r["check"] == SOURCE and r["status"] == "pass":
            figures = r["figures"]
            return {"losses": figures["trace_device"], "settings": figures["trace_settings"]}
    return None


def save(path: str, machine: Machine, results: list[dict]) -> str:
    """Write this run's trace to `path` under this machine's key; the line to print."""
    trace = observed(results)
    if trace is None:
        return f"goldens: none written to {path}: {SOURCE} did not pass in this run"
    goldens = read(path) if Path(path).exists() else {}
    if isinstance(goldens, str):
        return f"goldens: none written: {goldens}"
    written = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    goldens[key(machine)] = {**trace, "written": written}
    staged = Path(f"{path}.tmp")
    staged.write_text(json.dumps({"format": FORMAT, "goldens": goldens}, indent=1) + "\n")
    os.replace(staged, path)
    return f"goldens: {len(trace['losses'])} losses written to {path} as {key(machine)!r}"


def judge(c: Check, goldens: dict, results: list[dict]) -> tuple[str, str]:
    """(status, detail) of this run's trace against the golden of its key in `goldens`:
    skip where there is none to compare (another key: reported), FAIL past GOLDEN_TOLERANCE."""
    trace, here = observed(results), key(c.machine)
    if trace is None:
        return "skip", f"no trace to compare: {SOURCE} did not pass in this run"
    golden = goldens.get(here)
    if golden is None:
        held = "; ".join(goldens) or "none"
        return "skip", f"no golden of {here!r} (the file holds: {held}); not compared"
    if golden.get("settings") != trace["settings"]:
        return "skip", f"the golden of {here!r} has other settings: --export-goldens anew"
    ours, theirs = trace["losses"], golden.get("losses") or []
    if len(ours) != len(theirs):
        return "FAIL", f"{len(ours)} losses against the golden's {len(theirs)}"
    gaps = [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    gap = max(gaps) if all(math.isfinite(g) for g in gaps) else math.inf
    c.figures["golden_max_diff"] = gap
    c.target("loss trace vs its golden, max |diff|", gap, GOLDEN_TOLERANCE, True, True)
    if not gap <= GOLDEN_TOLERANCE:
        i = next(i for i, g in enumerate(gaps) if not g <= GOLDEN_TOLERANCE)
        return "FAIL", (
            f"step {i + 1}: {ours[i]:.7f} against the golden's {theirs[i]:.7f} of {here!r} "
            f"(written {golden.get('written')}; at most {GOLDEN_TOLERANCE:g})"
        )
    how = "bitwise equal to" if gap == 0 else f"within {gap:.0e} of"
    return "pass", f"{len(ours)} losses {how} the golden of {here!r}"


def compared(path: str, goldens: dict, machine: Machine, results: list[dict]) -> dict:
    """The report's row of judge(): this run's trace against `goldens` (read from `path`)."""
    c = Check(machine, Path("goldens"), 0.0)
    status, detail = judge(c, goldens, results)
    cpu = " --allow-cpu" if machine.device == "cpu" else ""
    again = f"PYTHONPATH=. python3 scripts/gpu_check.py --only {SOURCE} --goldens {path}{cpu}"
    return {
        "check": "goldens",
        "status": status,
        "seconds": 0.0,
        "detail": detail,
        "figures": c.figures,
        "targets": c.targets,
        "covers": ["deterministic"],
        "warnings": [],
        "reproduce": [again],
        "output": "",
    }
