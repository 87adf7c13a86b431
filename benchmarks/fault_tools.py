"""Fault injection over the baked project's tools: export under a file-size limit and on a full
disk, damaged run records, damaged DCP shards, hostile sizes, bad predict inputs, damaged
sweeps and stop signals. Each case must end clean: the documented exit code (0 success; 2 bad
input, with exactly one `error:` line on stderr under 1 KB; 75 stopped), no traceback, abort
or death by signal, within the timeout, nothing that existed before lost or changed, no
temporary files left.

    python benchmarks/fault_tools.py                          # every case (~20-40 min)
    python benchmarks/fault_tools.py --quick                  # one case per family
    python benchmarks/fault_tools.py --only predict-          # cases whose name holds this
    python benchmarks/fault_tools.py --project /tmp/b/my-pytorch-project --json faults.json
    python benchmarks/fault_tools.py --list                   # the case names, nothing run

Bakes the template (env_manager=none, run_smoke_test=no, init_git=no) into a temporary folder
unless --project names a bake, then prepares, once, the tiny CPU runs the cases copy: the
synthetic demo (syn, with an artifact of each export format), a CSV classification (cls) and
regression (reg) run, a 2-rank fsdp run under torchrun on gloo (sharded checkpoints) and a
2-trial sweep. Each case damages a fresh copy of what it needs and runs one command in a
subprocess with --timeout (a timeout is a failure, "hang"). Full-disk cases mount a small
tmpfs and need root; without it they are listed as not run. ONNX cases run when onnx and
onnxscript import. Prints a line per case (name, outcome, seconds), "N cases, F failures"
and the distinct failure reasons; --json writes every result; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fault_cases as fc  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent
FAST = {"env_manager": "none", "run_smoke_test": "no", "init_git": "no", "preset": "full"}
ABORT = re.compile(r"Aborted|terminate called|core dumped|Fatal Python error|Segmentation fault")
EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b")
TEMP = re.compile(r"^\..*\.tmp|\.tmp$|\.partial$")
MOUNTED: set[str] = set()  # tmpfs mounted by cases, unmounted however the driver ends
ARTIFACT = {"torchscript": "best.torchscript.pt", "export": "best.pt2", "onnx": "best.onnx"}


@dataclasses.dataclass
class Outcome:
    rc: int | None  # None: killed at the timeout
    out: str
    err: str
    seconds: float


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    formats = export_formats()
    cases = select(fc.all_cases(formats), args)
    if args.list:
        print("\n".join(f"{c.family:13s} {c.name}" for c in cases))
        print(f"{len(cases)} cases")
        return 0
    with tempfile.TemporaryDirectory(prefix="fault-tools-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        project = Path(args.project).resolve() if args.project else bake(work)
        start = time.perf_counter()
        ctx = prepare(project, work / "base", formats, cases, args)
        print(f"prepared {', '.join(ctx.prepared)} in {time.perf_counter() - start:.0f}s")
        signal.signal(signal.SIGTERM, interrupt)
        try:
            results = run_all(ctx, cases, work / "cases", args)
        finally:
            for mount in sorted(MOUNTED):  # left by an interrupted case
                subprocess.run(["umount", "-l", mount], check=False)
        elapsed = time.perf_counter() - start
    return summarise(results, ctx, elapsed, args)


def interrupt(signum, frame):
    raise KeyboardInterrupt


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", help="an existing bake (default: bake the template)")
    p.add_argument("--only", action="append", help="run cases whose name holds this (repeatable)")
    p.add_argument("--quick", action="store_true", help="one case per family")
    p.add_argument("--list", action="store_true", help="print the case names and stop")
    p.add_argument("--timeout", type=float, default=120, help="seconds per case (default 120)")
    p.add_argument(
        "--slow", type=float, default=40, help="seconds a hostile-size case may take (default 40)"
    )
    p.add_argument("--parallel", type=int, default=1, help="cases side by side (default 1)")
    p.add_argument("--keep", help="work here and keep it (bases, cases, logs)")
    p.add_argument("--json", help="write every case's result here")
    return p.parse_args(argv)


def select(cases: list, args) -> list:
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    if args.quick:
        seen: set[str] = set()
        cases = [c for c in cases if not (c.family in seen or seen.add(c.family))]
    return cases


def bake(work: Path) -> Path:
    from cookiecutter.main import cookiecutter

    return Path(
        cookiecutter(str(TEMPLATE), no_input=True, extra_context=FAST, output_dir=str(work))
    )


def export_formats() -> list[str]:
    """torchscript and export always; onnx when its packages import."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return ["torchscript", "export"]
    return ["torchscript", "export", "onnx"]


def child_env(project: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"}
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


# ---- the bases: tiny runs prepared once --------------------------------------------------


class Context:
    """What every case reads: the project, the base runs and facts about them."""

    def __init__(self, project: Path, base: Path, formats: list[str]):
        self.project, self.base, self.runs = project, base, base / "runs"
        self.env = child_env(project)
        self.formats = formats
        self.artifacts = ARTIFACT
        self.sizes: dict[str, int] = {}
        self.steps: dict[str, int] = {}
        self.prepared: list[str] = []
        self.sample_shape = (3, 8, 8)  # TINY's synthetic images
        self.can_mount, self.can_mount_why = fc.can_mount()
        self.cls_table = table(base, "cls")
        self.reg_table = table(base, "reg")


def table(base: Path, kind: str) -> tuple[list[str], list[list[str]]]:
    """A 160-row table: 4 features and a class (cls: a, b, c) or a value (reg: y)."""
    import random

    rng = random.Random(kind)
    header = ["f0", "f1", "f2", "f3", "label" if kind == "cls" else "y"]
    rows = []
    for _ in range(160):
        f = [rng.gauss(0, 1) for _ in range(4)]
        s = f[0] + 0.5 * f[1]
        target = "abc"[(s > -0.5) + (s > 0.5)] if kind == "cls" else f"{2 * s + f[3]:.4f}"
        rows.append([f"{v:.4f}" for v in f] + [target])
    return header, rows


def prepare(project: Path, base: Path, formats: list[str], cases: list, args) -> Context:
    """The bases the cases need; in a --keep folder, those it lacks (ready.json lists them)."""
    base.mkdir(parents=True, exist_ok=True)
    ctx = Context(project, base, formats)
    ready = base / "ready.json"
    if ready.is_file():
        ctx.prepared, ctx.sizes, ctx.steps = json.loads(ready.read_text())
    needs = {n for c in cases for n in c.needs}
    jobs = [n for n in ("syn", "cls", "reg", "fsdp", "sweep") if n in needs - set(ctx.prepared)]
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        ctx.prepared += pool.map(lambda n: base_run(ctx, n, args.timeout * 3), jobs)
    for fmt in [f for f in formats if f not in ctx.sizes] if "syn" in ctx.prepared else []:
        cmd = fc.py("export", "--checkpoint", str(ctx.runs / "syn/best.pt"), "--format", fmt)
        run_base(ctx, f"the {fmt} export", cmd, args.timeout)
        ctx.sizes[fmt] = (ctx.runs / "syn" / ARTIFACT[fmt]).stat().st_size
    for name in ("syn", "cls", "reg", "fsdp"):
        steps = sorted((ctx.runs / name).glob("step-*.pt"))
        if steps:
            ctx.steps[name] = int(steps[-1].stem.split("-")[1])
    full = base / "full.pt"  # the newest sharded checkpoint consolidated, to compare against
    if "fsdp" in ctx.prepared and not full.is_file():
        newest = max((ctx.runs / "fsdp").glob("step-*.pt"))
        cmd = fc.py("consolidate", "--checkpoint", str(newest), "--out", str(full))
        run_base(ctx, "the consolidated fsdp checkpoint", cmd, args.timeout)
    ready.write_text(json.dumps([ctx.prepared, ctx.sizes, ctx.steps]))
    return ctx


def base_run(ctx: Context, name: str, timeout: float) -> str:
    out = f"run.output_dir={ctx.runs}"
    if name == "syn":
        cmd = fc.py("train", *fc.TINY, "run.name=syn", out)
    elif name in ("cls", "reg"):
        path = ctx.base / f"{name}.csv"
        fc.write_table(path, ctx.cls_table if name == "cls" else ctx.reg_table, rows=160)
        task = "classification" if name == "cls" else "regression"
        label = "label" if name == "cls" else "y"
        cmd = fc.py("train", *fc.MLP, "data.name=csv", f"data.path={path}", f"data.label={label}")
        cmd += [f"task.name={task}", f"run.name={name}", out]
    elif name == "fsdp":
        cmd = [
            *fc.TORCHRUN,
            *fc.py("train", *fc.TINY, "train.strategy=fsdp", "run.name=fsdp", out),
        ]
    else:
        cmd = fc.py("sweep", "--name", "sw", *fc.SWEEP_FIXED, fc.SWEEP_AXIS, out)
    run_base(ctx, name, cmd, timeout)
    return name


def run_base(ctx: Context, name: str, cmd: list[str], timeout: float) -> None:
    res = execute(ctx, fc.Plan(cmd, (0,)), timeout)
    if res.rc != 0:
        sys.exit(
            f"preparing {name} failed (exit {res.rc}): {' '.join(cmd)}\n{res.out[-2000:]}"
            f"{res.err[-3000:]}"
        )


# ---- running and judging one case -------------------------------------------------------


def run_all(ctx: Context, cases: list, root: Path, args) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)

    def one(case) -> dict:
        res = run_case(ctx, case, root / case.name, args)
        line = f"{case.name:44s} {res['outcome']:7s} {res['seconds']:6.1f}s"
        print(line + (f"  {res['reason']}" if res["reason"] else ""), flush=True)
        return res

    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        return list(pool.map(one, cases))


def run_case(ctx: Context, case, folder: Path, args) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plan = None
    try:
        plan = case.prepare(ctx, folder)
        MOUNTED.update(map(str, plan.mounts))
        if plan.skip:
            return result(case, "SKIPPED", plan.skip, None)
        before = {p: digest(p) for p in plan.keep + plan.keep_refused}
        res = execute(ctx, plan, args.timeout)
        reason = judge(plan, res, before, args)
        (folder / "output.txt").write_text(f"{plan.cmd}\nrc={res.rc}\n{res.out}\n--\n{res.err}")
        return result(case, "FAIL" if reason else "CLEAN", reason, res)
    except Exception as exc:  # the driver's own fault (a copy, a mount): shown, counted
        return result(case, "FAIL", f"driver error: {type(exc).__name__}: {exc}", None)
    finally:
        for mount in {*(plan.mounts if plan else []), folder / "disk"}:
            if os.path.ismount(mount):  # the case's tmpfs, also when its prepare failed
                subprocess.run(["umount", "-l", str(mount)], check=False)
            MOUNTED.discard(str(mount))
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def result(case, outcome: str, reason: str | None, res: Outcome | None) -> dict:
    return {
        "case": case.name,
        "family": case.family,
        "outcome": outcome,
        "reason": reason,
        "rc": res.rc if res else None,
        "seconds": res.seconds if res else 0.0,
        "stderr_tail": res.err[-600:] if res else "",
    }


def execute(ctx: Context, plan, timeout: float) -> Outcome:
    """Run the plan's command in its own session; send its signals; kill it at the timeout.
    Output goes through pipes, not files: a file-size limit must not hit the capture."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *plan.cmd],
        cwd=ctx.project,
        env=ctx.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=limits(plan),
    )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=drain, args=a) for a in ((proc.stdout, out), (proc.stderr, err))
    ]
    for reader in readers:
        reader.start()
    send_signals(proc, plan.signals, out, start + timeout)
    try:
        rc = proc.wait(timeout=max(0.1, start + timeout - time.perf_counter()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    for reader in readers:
        reader.join(timeout=10)
    seconds = time.perf_counter() - start
    return Outcome(rc, text(out), text(err), seconds)


def drain(pipe, chunks: list[bytes]) -> None:
    for chunk in iter(lambda: pipe.read1(65536), b""):
        chunks.append(chunk)


def text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", "replace")


def limits(plan):
    if plan.fsize is None and plan.memory is None:
        return None

    def apply() -> None:
        if plan.fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (plan.fsize, plan.fsize))
        if plan.memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (plan.memory, plan.memory))

    return apply


def send_signals(proc, steps, out: list[bytes], deadline: float) -> None:
    """Each step: wait for a text in stdout (None: no wait), sleep, then send the signal."""
    for wanted, delay, sig in steps:
        while wanted and wanted not in text(out) and proc.poll() is None:
            if time.perf_counter() > deadline:
                return
            time.sleep(0.05)
        time.sleep(delay)
        if proc.poll() is not None:
            return
        proc.send_signal(sig)


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def judge(plan, res: Outcome, before: dict, args) -> str | None:
    """The reason a case did not end clean, or None."""
    text = res.out + "\n" + res.err
    if res.rc is None:
        return f"hang: no exit in {args.timeout:.0f}s"
    if res.rc < 0:
        return f"killed by signal: {signal.Signals(-res.rc).name}"
    if "Traceback" in (ranks_output(text) if plan.torchrun else text):
        return f"traceback: {root_error(text)}"
    if plan.torchrun and res.rc in (1, 2) and not re.search(r"^(\[\w+\]:)?error: ", text, re.M):
        return f"exit {res.rc} under torchrun without an error: line: {first_line(res.err)}"
    if ABORT.search(text):
        return f"abort: {ABORT.search(text).group(0)}"
    if res.rc not in plan.expect:
        line = first_line(res.err) or first_line(res.out)
        return f"exit {res.rc} (expected {'/'.join(map(str, plan.expect))}): {line}"
    if res.rc == 2 and not plan.torchrun:
        lines = [ln for ln in res.err.splitlines() if ln.strip()]
        if len(lines) != 1 or not lines[0].startswith("error:"):
            return f"stderr not one error: line: {len(lines)} lines, first {first_line(res.err)}"
        if len(res.err.encode()) > 1024:
            return f"error line too long: {len(res.err.encode())} bytes"
    for path in plan.keep + (plan.keep_refused if res.rc != 0 else []):
        now = digest(path)
        if now != before[path]:
            what = "lost" if now is None else "created" if before[path] is None else "changed"
            return f"{what}: {path.name}"
    for folder in plan.clean:
        left = (
            [p.name for p in folder.rglob("*") if TEMP.search(p.name)] if folder.exists() else []
        )
        if left:
            return f"temp file left: {left[0]}"
    if plan.timed and res.seconds > args.slow:
        return f"slow: {res.seconds:.0f}s, over {args.slow:.0f}s"
    return plan.check(res) if plan.check else None


def ranks_output(text: str) -> str:
    """What the ranks printed, without torchrun's own report of a failed rank (its agent's
    "failed (exitcode: N)" line and ChildFailedError traceback): torchrun prints that for
    every non-zero exit, a rank's one-line refusal included."""
    return re.split(r"\n[^\n]*elastic/multiprocessing/api\.py[^\n]*failed \(exitcode", text)[0]


def root_error(text: str) -> str:
    """The exception line that ends the first traceback (the root one: under torchrun the
    ranks' come before torchrun's own), without rank prefixes and paths."""
    lines = [re.sub(r"^\[(default)?rank\d+\]:", "", ln) for ln in text.splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    idx = min(i for i, ln in enumerate(lines) if "Traceback" in ln)
    tail = [ln.strip() for ln in lines[idx + 1 :] if EXCEPTION.match(ln.strip())]
    return shorten(tail[0] if tail else lines[-1])


def first_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return shorten(lines[0]) if lines else "(nothing)"


def shorten(line: str) -> str:
    line = re.sub(r"/\S*/", "<path>/", line.strip())
    return line[:150]


# ---- the summary -------------------------------------------------------------------------


def group(reason: str) -> str:
    """Reasons that differ only in numbers after the first ':' (positions, sizes) group."""
    head, colon, detail = reason.partition(": ")
    return (head + colon + re.sub(r"(?<![\w-])\d+(\.\d+)?(?!\w)", "N", detail))[:110]


def summarise(results: list[dict], ctx: Context, elapsed: float, args) -> int:
    ran = [r for r in results if r["outcome"] != "SKIPPED"]
    failures = [r for r in ran if r["outcome"] == "FAIL"]
    print(f"{len(ran)} cases, {len(failures)} failures ({elapsed:.0f}s)")
    skipped = [r for r in results if r["outcome"] == "SKIPPED"]
    if skipped:
        print(f"not run: {len(skipped)} cases ({skipped[0]['reason']})")
    if "onnx" not in ctx.formats:
        print("not run: onnx export cases (pip install onnx onnxscript onnxruntime)")
    groups = collections.defaultdict(list)
    for r in failures:
        groups[group(r["reason"])].append(r["case"])
    for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(names):3d} x {reason}\n        {', '.join(names)}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "results": results, "elapsed_s": elapsed}, indent=2)
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
