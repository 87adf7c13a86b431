"""GPU check: every CUDA path of the project on this machine, its numbers and its speed
against the ceiling, then a pass/fail table and (with --json) a report.

    PYTHONPATH=. python3 scripts/gpu_check.py --json gpu-check.json   # or: make gpu-check
    python scripts/gpu_check.py --list           # the checks, what each runs and covers
    python scripts/gpu_check.py --only resume,ddp --keep --timeout 900
    python scripts/gpu_check.py --json r.json --resume   # rerun what did not pass in r.json
    python scripts/gpu_check.py --allow-cpu      # no GPU: the checks that run on CPU
    python scripts/gpu_check.py --quick          # six checks, ~4 minutes: make gpu-check-quick
    python scripts/gpu_check.py --group 2        # one group of the default run (--list)
    python scripts/gpu_check.py --quick --export-goldens goldens.json   # later: --goldens

Each check runs the project's own commands (scripts/*.py, pytest, torchrun) on tiny settings in
a temporary folder (kept with --keep), or measures in a child interpreter of its own; on one
GPU two ranks share it over gloo. A check passes, fails (one line of detail, the end of its
output, the command that reproduces it) or skips; a speed or a numeric tolerance missed fails
its check. A last row fails if any run printed a warning. The output ends with a block a
script greps (`---`, then `checks_passed: N/M`, `seconds`, `peak_vram_mb`, `mfu_percent`,
`trainer_vs_loop`, `device`, `torch`, `cuda`). SIGTERM or Ctrl-C stops the check and its
processes, writes the report so far and exits 75 (rerun with --resume). Exit codes:
0 no check failed, 1 a check failed, 2 no CUDA GPU (without --allow-cpu) or bad arguments,
3 checks left out by --budget (or stopped by its end), 75 stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

STARTED = time.monotonic()  # the block's seconds count the script's own start (torch, CUDA)
ROOT = Path(__file__).resolve().parents[1]
# This tree's package, installed or not: the check proves the tree it is in.
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import torch  # noqa: E402
from gpu_checks import goldens, registry, report  # noqa: E402
from gpu_checks.common import Check, Failed, Machine, OutOfBudget, Skipped  # noqa: E402
from gpu_checks.registry import CHECKS, QUICK, expected_seconds  # noqa: E402

from {{ cookiecutter.package_name }}.tools.cli import Parser  # noqa: E402

SPECS = {spec.name: spec for spec in (*QUICK, *CHECKS)}
CPU_SLOWER = 5  # a check's time limit on the CPU, against its limit on a GPU


class Stopped(BaseException):
    """SIGTERM or SIGINT: not an Exception, so that no check's `except Exception` takes it."""


def find_machine() -> Machine | str:
    """This machine's GPUs, or why there are none to check."""
    if torch.cuda.is_available():
        capability = tuple(torch.cuda.get_device_capability(0))
        return Machine(
            "cuda", torch.cuda.device_count(), capability, torch.cuda.get_device_name(0)
        )
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


def run_check(
    name: str, machine: Machine, workdir: Path, deadline: float, budget_end: bool = False
) -> dict:
    """Run check `name` (in a worker process if its spec says so); its result. `budget_end`:
    the deadline is --budget's end, so that a check stopped there is not run, not failed."""
    spec = SPECS[name]
    workdir.mkdir(parents=True)
    start = time.monotonic()
    check = Check(machine, workdir, deadline, budget_end)
    output = command = ""
    stopped = None
    try:
        status = "pass"
        detail = check.in_worker(name) if spec.worker else spec.run(check)
    except Skipped as exc:
        status, detail = "skip", str(exc)
    except OutOfBudget as exc:  # rerun with --resume, as the checks left out by --budget
        status, detail = "not run", str(exc)
    except Failed as exc:
        status, detail, output, command = "FAIL", str(exc), exc.output, exc.command
    except Exception as exc:  # a bug or a surprise in the check itself is a failure too
        status, detail, output = "FAIL", f"{type(exc).__name__}: {exc}", traceback.format_exc()
    except Stopped as exc:
        status, detail, stopped = "stopped", f"stopped by {exc}", str(exc)
    finally:  # also on SIGTERM and Ctrl-C, which the children's own sessions do not receive
        check.kill_all()
    missed = [t for t in check.targets if t["pass"] is False]
    if status == "pass" and missed:
        status = "FAIL"
        detail = f"missed {missed[0]['name']}: {missed[0]['value']:.3g} ({missed[0]['target']})"
    result = report.result(spec, status, time.monotonic() - start, detail, check, machine)
    result.update(output=output, reproduce=report.reproduce(name, machine, command))
    return {**result, "stopped_by": stopped} if stopped else result


def run_worker(args, machine: Machine) -> int:
    """--worker: run one check here and write its result where the parent reads it."""
    check = Check(machine, Path(args.workdir), float("inf"))
    found = {"status": "pass", "output": "", "command": ""}
    try:
        found["detail"] = SPECS[args.worker].run(check)
    except Skipped as exc:
        found.update(status="skip", detail=str(exc))
    except Failed as exc:
        found.update(status="FAIL", detail=str(exc), output=exc.output, command=exc.command)
    except Exception as exc:  # a surprise: reported with what was measured before it
        output = traceback.format_exc()
        found.update(status="FAIL", detail=f"{type(exc).__name__}: {exc}", output=output)
    found.update(figures=check.figures, targets=check.targets, warnings=check.warnings)
    Path(args.result).write_text(json.dumps(found, default=str))
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    # An argument error: one bounded line
    parser = Parser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="run only these checks")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--timeout", type=float, help="seconds per check (default: its own)")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole run: checks that would start later are left out, one "
        "still running at its end is stopped; both not run (exit 3, rerun with --resume)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="the quick set: six checks, ~4 minutes on an H200"
    )
    parser.add_argument("--group", metavar="N|NAME", help="one group of the default run (--list)")
    parser.add_argument("--allow-cpu", action="store_true", help="without a GPU, run on CPU")
    parser.add_argument("--json", metavar="FILE", help="write the report here (after each check)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --json: keep the checks that passed or skipped in FILE, run the others",
    )
    parser.add_argument(
        "--export-goldens",
        metavar="FILE",
        help="write quick_trace's per-step losses to FILE under this GPU, torch and CUDA",
    )
    parser.add_argument(
        "--goldens",
        metavar="FILE",
        help="compare quick_trace's losses with FILE's golden of this GPU, torch and CUDA "
        "(a file without one is reported, not failed)",
    )
    for hidden in ("--worker", "--result", "--workdir"):  # how a check runs in a child
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.names = chosen(args, parser)
    if args.resume and not (args.json and Path(args.json).is_file()):
        parser.error("--resume needs --json FILE naming an earlier report")
    if (args.goldens or args.export_goldens) and goldens.SOURCE not in args.names:
        parser.error(f"goldens hold {goldens.SOURCE}'s losses: add --quick (or --only it)")
    args.golden_data = goldens.read(args.goldens) if args.goldens else None
    if isinstance(args.golden_data, str):
        parser.error(f"{args.golden_data}; --export-goldens FILE writes one")
    return args


def chosen(args, parser) -> list[str]:
    """The checks to run: --only's, --quick's, --group's (one of them) or the default run."""
    given = [f"--{k}" for k in ("only", "quick", "group") if getattr(args, k)]
    if len(given) > 1:
        parser.error(f"{given[0]} and {given[1]} both choose the checks: give one of them")
    if args.quick:
        return [spec.name for spec in QUICK]
    if args.group:
        names = registry.group(args.group)
        if names is None:
            known = ", ".join(f"{i} {name}" for i, name in enumerate(registry.GROUPS, 1))
            parser.error(f"unknown group {args.group!r}; the groups: {known}")
        return names
    default = [s.name for s in CHECKS if s.default]
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else default
    unknown = [n for n in names if n not in SPECS]
    if unknown or not names:
        parser.error(
            f"unknown check {unknown[0] if unknown else ''!r}; the checks: {', '.join(SPECS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.list:
        sets = registry.sets()  # the last: the checks in no group, minutes, run apart
        estimates = {title: registry.estimate(sets[title]) for title in list(sets)[:-1]}
        print(report.listing(sets, estimates, expected_seconds(CHECKS)))
        return 0
    machine = find_machine()
    if isinstance(machine, str):
        if not args.allow_cpu:
            print(
                f"no CUDA GPU visible: {machine}; `python scripts/doctor.py` says why "
                "(--allow-cpu runs the checks on CPU)"
            )
            return 2
        machine = Machine("cpu", 0, None)
    if args.worker:
        return run_worker(args, machine)
    args.kept = report.kept(args.json, machine, args.names) if args.resume else {}
    if isinstance(args.kept, str):
        print(f"error: {args.kept}", file=sys.stderr)
        return 2
    return run_all(args, machine)


def run_all(args, machine: Machine) -> int:
    """Run args.names (taking args.kept's results as they are), writing the report after
    each."""
    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    # One compile cache for the run's processes: a graph compiled once is not compiled again.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor"))
    start = time.monotonic()
    end = start + args.budget if args.budget else float("inf")
    print(f"gpu check on {report.describe(machine)}; work folder {workdir}", flush=True)
    results: list[dict] = []
    stopped = None

    def on_signal(signum, _frame):
        raise Stopped(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i, name in enumerate(args.names, 1):
            try:
                stopped = run_next(args, machine, workdir, (i, name), end, results, stopped)
            except Stopped as exc:  # outside a check: between two, or while writing
                stopped = str(exc)
            if not any(r["check"] == name for r in results):
                results.append(report.not_run(SPECS[name], f"stopped by {stopped}", machine))
            report.write(args.json, machine, results, start, stopped)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.goldens and not stopped:
        results.append(goldens.compared(args.goldens, args.golden_data, machine, results))
    found = report.build(machine, results, start, stopped)
    block = report.block(found, machine, time.monotonic() - STARTED)
    final = report.write(args.json, machine, results, start, stopped, block=block)
    print(f"\n{report.table(final)}\n")
    kept_note = f"; outputs kept in {workdir}" if args.keep else ""
    print(f"{report.summary_line(final, time.monotonic() - start)}{kept_note}")
    if args.export_goldens and not stopped:
        print(goldens.save(args.export_goldens, machine, results))
    print(report.block_text(block))
    return report.exit_code(final)


def run_next(args, machine, workdir: Path, at: tuple, end: float, results: list, stopped):
    """The result of check `at` = (position, name) appended to `results`: the kept one (with
    --resume), or not run (stopped, or no time left before `end`), or a new run. Returns what
    stopped the run (None: nothing yet)."""
    i, name = at
    if name in args.kept:
        results.append({**args.kept[name], "resumed": True})
        return stopped
    if stopped or time.monotonic() + 5 > end:
        why = f"stopped by {stopped}" if stopped else "--budget spent"
        results.append(report.not_run(SPECS[name], why, machine))
        return stopped
    limit = args.timeout or SPECS[name].limit * (CPU_SLOWER if machine.device == "cpu" else 1)
    print(f"[{i}/{len(args.names)}] {name} ... ", end="", flush=True)
    own = time.monotonic() + limit
    result = run_check(name, machine, workdir / name, min(own, end), budget_end=end < own)
    results.append(result)
    print(f"{result['status']} ({result['seconds']:.1f}s)", flush=True)
    if result["status"] == "FAIL" and result["output"]:
        print("\n".join(f"    | {line}" for line in result["output"].splitlines()), flush=True)
    return result.get("stopped_by")


if __name__ == "__main__":
    raise SystemExit(main())
