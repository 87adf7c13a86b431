"""The check's report: each check's result (status, seconds, detail, figures, targets, the
CUDA paths it covers, the commands that reproduce it), the machine and versions, the warnings
the runs printed, what needs several GPUs; written as JSON and printed as tables."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed

from .common import EXIT_STOPPED, ROOT, Check, Machine
from .registry import CUDA_PATHS, SEVERAL_GPUS, Spec

STATUSES = ("pass", "FAIL", "skip", "stopped", "not run")


def command(name: str | None, machine: Machine) -> str:
    """How to run check `name` (None: all) again from the project root, installed or not."""
    only = f" --only {name}" if name else ""
    cpu = " --allow-cpu" if machine.device == "cpu" else ""
    return f"PYTHONPATH=. {Path(sys.executable).name} scripts/gpu_check.py{only}{cpu} --keep"


def reproduce(name: str, machine: Machine, failed: str = "") -> list[str]:
    """The check's own command, and the command inside it that failed (its files are in the
    work folder that --keep keeps)."""
    return [command(name, machine), *([f"cd {shlex.quote(str(ROOT))} && {failed}"] * bool(failed))]


def result(spec: Spec, status: str, seconds: float, detail: str, c: Check, m: Machine) -> dict:
    return {
        "check": spec.name,
        "status": status,
        "seconds": round(seconds, 1),
        "detail": " ".join(str(detail).split()),  # one line
        "figures": c.figures,
        "targets": c.targets,
        "covers": list(spec.covers),
        "warnings": c.warnings,
        "reproduce": reproduce(spec.name, m),
    }


def not_run(spec: Spec, why: str, machine: Machine) -> dict:
    empty = Check(machine, Path(spec.name), 0.0)
    return {**result(spec, "not run", 0.0, why, empty, machine), "output": ""}


def describe(machine: Machine) -> str:
    if machine.device == "cpu":
        return f"CPU only (--allow-cpu), torch {torch.__version__}"
    major, minor = machine.capability
    return (
        f"{machine.gpus} x {machine.name} (compute capability {major}.{minor}), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


def machine_facts(machine: Machine) -> dict:
    facts = {
        "device": machine.device,
        "gpus": [torch.cuda.get_device_name(i) for i in range(machine.gpus)],
        "capability": list(machine.capability) if machine.capability else None,
        "gpu_memory_gib": None,
        "cpus": os.cpu_count(),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    if machine.device == "cuda":
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30)
    return facts


def versions() -> dict:
    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None}
    if torch.cuda.is_available():
        found["cudnn"] = torch.backends.cudnn.version()
        nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
        found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    try:
        found["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        found["triton"] = None
    return found


def warnings_row(results: list[dict], machine: Machine) -> dict:
    """A last row: no run of any check printed a warning."""
    seen = [{**w, "check": r["check"]} for r in results for w in r.get("warnings", [])]
    detail = f"{len(seen)} warning line(s); first: {seen[0]['line']}" if seen else "none"
    return {
        "check": "no_warnings",
        "status": "FAIL" if seen else "pass",
        "seconds": 0.0,
        "detail": f"in the runs' output: {detail}",
        "figures": {"warnings": seen},
        "targets": [],
        "covers": ["tf32"],
        "warnings": [],
        "reproduce": sorted({f"cd {shlex.quote(str(ROOT))} && {w['command']}" for w in seen}),
    }


def build(machine: Machine, results: list[dict], start: float, stopped: str | None) -> dict:
    rows, elapsed = [*results, warnings_row(results, machine)], time.monotonic() - start
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    covered = {
        p: [r["check"] for r in rows if p in r["covers"] and r["status"] == "pass"]
        for p in CUDA_PATHS
    }
    return {
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - elapsed)),
        "seconds": round(elapsed, 1),
        "machine": machine_facts(machine),
        "versions": versions(),
        "stopped": stopped,
        "complete": counts["not run"] == 0 and not stopped,
        "summary": counts,
        "checks": rows,
        "targets": [t for r in rows for t in r["targets"]],
        "failed": {r["check"]: r["reproduce"] for r in rows if r["status"] == "FAIL"},
        "cuda_paths": {
            p: {"what": w, "sites": list(s), "passed_in": covered[p]}
            for p, (w, s) in CUDA_PATHS.items()
        },
        "needs_several_gpus": {"ran here": machine.gpus >= 2, "paths": SEVERAL_GPUS},
    }


def write(path: str | None, machine: Machine, results: list, start: float, stopped, **more):
    """The report so far (and `more` keys), written to `path` (when given) whole or not at
    all: a signal that arrives meanwhile waits until the file is in place."""
    found = {**build(machine, results, start, stopped), **more}
    if path:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            staged = Path(f"{path}.tmp")
            staged.write_text(json.dumps(found, indent=2, default=str) + "\n")
            os.replace(staged, path)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return found


def kept(path: str, machine: Machine, names) -> dict | str:
    """The results of `path` for checks `names` that passed or skipped, by check (for
    --resume); or why the report cannot be resumed."""
    try:
        old = json.loads(Path(path).read_text())
        gpus, checks = old["machine"]["gpus"], old["checks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (
            f"{path} is not a gpu_check report ({type(exc).__name__}: {exc}); run without --resume"
        )
    here = machine_facts(machine)["gpus"]
    if gpus != here:
        return f"{path} is from another machine (GPUs {gpus}, here {here}); run without --resume"
    return {
        r["check"]: r for r in checks if r["check"] in names and r["status"] in ("pass", "skip")
    }


def table(found: dict) -> str:
    rows = found["checks"]
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'check':<{width}}  result   time  detail"]
    for r in rows:
        status = r["status"].replace(" ", "-")  # one word: the table splits on spaces
        kept = " (kept from the earlier report)" if r.get("resumed") else ""
        lines.append(
            f"{r['check']:<{width}}  {status:<7}{r['seconds']:5.0f}s  {r['detail']}{kept}"
        )
    targets = found["targets"]
    if targets:
        name_width = max(len(t["name"]) for t in targets)
        lines += ["", f"{'target':<{name_width}}  {'value':>10}  goal     result"]
        for t in targets:
            judged = {True: "pass", False: "FAIL", None: "n/a (CPU)"}[t["pass"]]
            lines.append(
                f"{t['name']:<{name_width}}  {t['value']:>10.4g}  {t['target']:<8} {judged}"
            )
    return "\n".join(lines)


def summary_line(found: dict, seconds: float) -> str:
    c = found["summary"]
    line = f"gpu check: {c['pass']} passed, {c['FAIL']} failed, {c['skip']} skipped"
    if c["not run"] or found["stopped"]:
        line += f", {c['not run']} not run"
        line += f" (stopped by {found['stopped']})" if found["stopped"] else " (--budget)"
        line += "; rerun with --json FILE --resume"
    return f"{line} in {seconds:.0f}s"


def exit_code(found: dict) -> int:
    if found["stopped"]:
        return EXIT_STOPPED
    if found["summary"]["FAIL"]:
        return 1
    return 3 if found["summary"]["not run"] else 0


def listing(sets: dict[str, list[Spec]], estimates: dict, default: tuple) -> str:
    """Each set of checks (the quick set, the groups, the rest) with its estimate, then each
    check and what it covers, two lines each; last, how long a default run takes, `default`
    (registry.expected_seconds). The estimates are registry.estimate's, until measured."""
    width = max(len(spec.name) for specs in sets.values() for spec in specs)
    lines = []
    for title, specs in sets.items():
        if title in estimates:
            low, high = estimates[title]
            title += f": about {low:.0f} to {high:.0f} s on one H200"
        lines.append(title)
        for spec in specs:
            lines.append(f"  {spec.name:<{width}}  {' '.join(spec.run.__doc__.split())}")
            lines.append(f"  {'':<{width}}  covers: {', '.join(spec.covers)}")
    low, high = (round(s / 60) for s in default)
    lines.append(
        "The seconds are estimates (each check's limit over 3 to 4), until a GPU has run them."
    )
    lines.append(f"A default run takes about {low} to {high} minutes on one H200 (estimated).")
    return "\n".join(lines)


def block(found: dict, machine: Machine, seconds: float) -> dict:
    """The figures a script greps for at the end of a run, after a `---` line (block_text):
    checks passed of those not skipped, `seconds` (the script's own start included), the
    largest CUDA peak any check noted, the LM's MFU, the trainer against a plain loop, the
    device and versions; "n/a" where no check of the run measured it."""
    rows = [r for r in found["checks"] if r["status"] != "skip"]
    figures = [r["figures"] for r in found["checks"]]
    peaks = [f["peak_vram_mb"] for f in figures if f.get("peak_vram_mb") is not None]
    mfu = next((f["mfu"] for f in figures if f.get("mfu") is not None), None)
    ratio = next((f["trainer_vs_loop"] for f in figures if f.get("trainer_vs_loop")), None)
    return {
        "checks_passed": f"{sum(r['status'] == 'pass' for r in rows)}/{len(rows)}",
        "seconds": f"{seconds:.1f}",
        "peak_vram_mb": f"{max(peaks):.0f}" if peaks else "n/a",
        "mfu_percent": f"{100 * mfu:.1f}" if mfu is not None else "n/a",
        "trainer_vs_loop": f"{ratio:.3f}" if ratio is not None else "n/a",
        "device": machine.name,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }


def block_text(values: dict) -> str:
    return "\n".join(["---", *(f"{key}: {value}" for key, value in values.items())])
