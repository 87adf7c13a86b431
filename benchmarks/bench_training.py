"""Benchmark the baked project's training loop against a minimal loop and Lightning's Trainer.

    python benchmarks/bench_training.py             # ~5 min: 5 repeats of the default workload
    python benchmarks/bench_training.py --quick     # ~25 s: checks that every number comes out
    python benchmarks/bench_training.py --threads 1 --set model.width=8 --json results.json

One command: bakes the template (env_manager=none, run_smoke_test=no, init_git=no) into a
temporary folder, then runs, each in a fresh process and in rotating order, `--repeats` times:

  (a)  minimal    a hand-written loop: forward, loss, backward, step, nothing else (fused AdamW,
                  the implementation the project's trainer picks);
  (b)  project    the baked project's training entry point with its default features on
                  (progress bar, loss/lr/grad-norm logging, TensorBoard, metrics.csv, gradient
                  clipping, lr schedule, checkpoint at every epoch end); its validation is
                  timed and cut out of the interval;
  (c)  lightning  lightning.Trainer with its defaults (progress bar, TensorBoard logger,
                  checkpoint at epoch end) on the same model, loader, optimizer, schedule and
                  clipping, when `lightning` is installed (a peer, never a dependency of the
                  baked project);
  (a') minimal_torch_default  loop (a) with torch's default AdamW, for reference.

Same model, synthetic data, batch size, dtype (fp32) and torch.set_num_threads for all. The
first epoch is warm-up; samples/s are timed from the first step of the second epoch to the last
step, from optimizer-step time stamps; the median over repeats is reported, and ratios are
paired (per repeat, then the median). Start-to-first-step is measured from just before the
process is spawned, beside `python -c "import torch"` (and the same plus torch._dynamo, which
any torch.optim optimizer imports at its first use) spawned the same way. Children run in a
pseudo-terminal so progress bars draw as they would for a person watching. Runs during which
other processes used the CPUs are redone (see Noise). Performance targets are reported, never
asserted: they are measurements, not tests.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE.parent
LOOPS = ("minimal", "project", "lightning", "minimal_torch_default")
LABELS = {
    "minimal": "(a) minimal hand-written loop",
    "minimal_torch_default": "(a') minimal loop, torch's default AdamW",
    "project": "(b) baked project trainer",
    "lightning": "(c) Lightning Trainer",
}
FAST = {"env_manager": "none", "run_smoke_test": "no", "init_git": "no", "preset": "full"}
# Start-up references, spawned the same way as the loops: a bare `import torch`, and the same
# plus torch._dynamo, which the first optimizer.step() of any torch.optim optimizer imports.
REFERENCES = {
    "import torch": "import time; import torch; print('STAMP', time.time())",
    "import torch, torch._dynamo": (
        "import time; import torch, torch._dynamo; print('STAMP', time.time())"
    ),
}
TARGETS = {"b/a": 0.98, "b/c": 1.2, "startup_s": 1.0, "startup_over_minimal_s": 0.5}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = args.threads or _cpu_count()
    with_lightning = _has_lightning() and not args.no_lightning
    loops = [n for n in LOOPS if n != "lightning" or with_lightning]
    if args.quick:
        loops.remove("minimal_torch_default")  # informative only; CI checks the rest
    epochs = args.epochs or (3 if args.quick else 4)
    repeats = args.repeats or (1 if args.quick else 5)
    quick_set = ["data.train_size=512", "model.width=8"] if args.quick else []
    # Others may use the CPUs this run leaves free, less a margin; by default 10% at least.
    free = max(0.0, 1 - threads / os.cpu_count())
    threshold = args.noise if args.noise is not None else max(0.1, free - 0.1)
    noise = Noise(threshold, 0 if args.quick else args.retries, 0 if args.quick else 20)

    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        work = Path(args.workdir or tmp)
        project, package = bake(work, args.project)
        overrides = [
            "run.device=cpu",
            "data.val_size=256",  # validation is cut out of (b); a small split keeps runs short
            f"train.epochs={epochs}",
            *quick_set,
            *args.set,
        ]
        env = _child_env(project, threads)
        load_before = _loadavg()
        runs: dict[str, list[dict]] = {name: [] for name in (*REFERENCES, *loops)}
        for r in range(repeats):
            for name in REFERENCES:
                runs[name].append(noise.run(lambda n=name: spawn_reference(n, env, project)))
            for name in loops[r % len(loops) :] + loops[: r % len(loops)]:  # rotate the order

                def attempt(name=name, r=r):
                    tag = f"{name}{r}-{time.monotonic_ns()}"
                    spec = {
                        "package": package,
                        "threads": threads,
                        "workdir": str(work / tag),
                        "overrides": [
                            *overrides,
                            f"run.output_dir={work / 'runs'}",
                            f"run.name={tag}",
                        ],
                    }
                    return run_loop(name, spec, env, project, args.warmup_epochs)

                runs[name].append(noise.run(attempt))
                if args.verbose:
                    row = runs[name][-1]
                    print(
                        f"  repeat {r + 1} {name}: {row['samples_per_s']:.0f} samples/s, "
                        f"first step {row['start_to_first_step_s']:.2f} s, "
                        f"others used {row['interference']:.0%} of the CPUs",
                        flush=True,
                    )
        results = summarize(runs, loops)
        results["setup"] = {
            "machine": machine(),
            "threads": threads,
            "overrides": overrides,
            "epochs": epochs,
            "warmup_epochs": args.warmup_epochs,
            "repeats": repeats,
            "noise_threshold": threshold,
            "retried_runs": noise.retried,
            "loadavg_before": load_before,
            "loadavg_after": _loadavg(),
            "batch_size": runs["project"][0]["batch_size"],
            "steps_per_epoch": runs["project"][0]["steps_per_epoch"],
        }
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny workload, 1 repeat (CI)")
    p.add_argument("--repeats", type=int, default=0, help="runs of each loop (default 5)")
    p.add_argument("--epochs", type=int, default=0, help="epochs per run (default 4)")
    p.add_argument("--warmup-epochs", type=int, default=1, help="epochs left out of the rate")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all CPUs)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for all three loops, e.g. --set model.width=8",
    )
    p.add_argument("--no-lightning", action="store_true", help="skip (c) even if installed")
    p.add_argument("--project", help="benchmark this baked project instead of baking one")
    p.add_argument("--workdir", help="keep runs and the bake here (default: a temp folder)")
    p.add_argument("--json", help="write every number to this file")
    p.add_argument(
        "--noise",
        type=float,
        help="rerun a run if other processes used more than this share of all CPUs (default: "
        "the share this run leaves free less 0.1, at least 0.1)",
    )
    p.add_argument("--retries", type=int, default=3, help="reruns of a noisy run (default 3)")
    p.add_argument("--verbose", action="store_true", help="print each run as it finishes")
    return p.parse_args(argv)


def bake(work: Path, existing: str | None) -> tuple[Path, str]:
    """Bake the template with the fast options (or take an existing bake); byte-compile it so
    the first timed run does not pay for writing .pyc files."""
    if existing:
        project = Path(existing).resolve()
    else:
        from cookiecutter.main import cookiecutter

        out = cookiecutter(
            str(TEMPLATE),
            no_input=True,
            extra_context={**FAST, "project_name": "Bench Lab"},
            output_dir=str(work / "bake"),
        )
        project = Path(out)
    package = json.loads((project / ".cookiecutter.json").read_text())["package_name"]
    compileall.compile_dir(project / package, quiet=1)
    return project, package


def run_loop(name: str, spec: dict, env: dict, project: Path, warmup: int) -> dict:
    spec_path = Path(spec["workdir"] + ".spec.json")
    out_path = Path(spec["workdir"] + ".json")
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(HERE / "loops.py"), name, str(spec_path), str(out_path)]
    run = spawn(cmd, env, project)
    if run["code"] != 0 or not out_path.exists():
        raise RuntimeError(f"loop {name} failed (exit {run['code']}):\n{run['output'][-3000:]}")
    row = steady_state(json.loads(out_path.read_text()), warmup, run["start"])
    return {**row, "interference": run["interference"]}


def steady_state(raw: dict, warmup: int, start: float) -> dict:
    """Rates from a loop's step stamps (perf_counter) and start-up from its wall-clock marks;
    `start` is the wall-clock time just before the process was spawned."""
    stamps, batch = raw["stamps"], raw["batch_size"]
    first = warmup * raw["steps_per_epoch"]  # steps [0, first) are warm-up
    if len(stamps) < first + 2:
        raise RuntimeError(f"{len(stamps)} steps: none to time after {warmup} warm-up epoch(s)")
    # From the first step after warm-up (so the warm-up epoch's own end, e.g. lazy imports at
    # the first log, stays out) to the last step, less the spans cut out (validation).
    t0, t1 = stamps[first], stamps[-1]
    cut = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in raw["excluded"])
    steps = len(stamps) - 1 - first
    marks = raw["marks"]
    return {
        "samples_per_s": steps * batch / (t1 - t0 - cut),
        "ms_per_step": 1e3 * (t1 - t0 - cut) / steps,
        "excluded_s": cut,
        "steps": len(stamps),
        "batch_size": batch,
        "steps_per_epoch": raw["steps_per_epoch"],
        "threads": marks.get("threads"),
        "start_to_first_step_s": marks["first_step"] - start,
        "start_to_imports_s": marks["imports_done"] - start,
    }


def spawn_reference(name: str, env: dict, cwd: Path) -> dict:
    run = spawn([sys.executable, "-c", REFERENCES[name]], env, cwd)
    stamp = [line for line in run["output"].splitlines() if line.startswith("STAMP")]
    if run["code"] != 0 or not stamp:
        raise RuntimeError(f"{REFERENCES[name]!r} failed (exit {run['code']}):\n{run['output']}")
    return {
        "start_to_first_step_s": float(stamp[-1].split()[1]) - run["start"],
        "interference": run["interference"],
    }


class Noise:
    """Other processes on the machine distort timings (2 cores shared with running tests are
    the norm here). Before each run wait (up to `max_wait` s) for the CPUs to be idle; after it,
    measure the CPU time others used during the run from /proc/stat minus the child's own
    (`interference`, a share of all CPUs) and rerun it up to `retries` times while that share
    is above `threshold`, keeping the quietest attempt. Linux only; elsewhere runs once."""

    def __init__(self, threshold: float, retries: int, max_wait: float):
        self.threshold, self.retries, self.max_wait = threshold, retries, max_wait
        self.retried = 0

    def run(self, attempt) -> dict:
        best = None
        for i in range(self.retries + 1):
            self.wait_for_quiet()
            row = attempt()
            if best is None or (row["interference"] or 0) < (best["interference"] or 0):
                best = row
            if (row["interference"] or 0) <= self.threshold:
                break
            if i < self.retries:
                self.retried += 1
        return best

    def wait_for_quiet(self) -> None:
        deadline = time.monotonic() + self.max_wait
        while time.monotonic() < deadline:
            before = _busy_cpu_s()
            if before is None:
                return
            time.sleep(0.5)
            if (_busy_cpu_s() - before) / (0.5 * os.cpu_count()) <= self.threshold:
                return


def spawn(cmd: list[str], env: dict, cwd: Path, timeout: float = 900) -> dict:
    """Run `cmd` with a pseudo-terminal as stdout/stderr where there is one; return the wall
    time just before the spawn, the exit code, the output, and the share of all CPUs that other
    processes used meanwhile (None where /proc/stat is missing)."""
    busy0, wall0, own0 = _busy_cpu_s(), time.monotonic(), _children_cpu_s()
    start, code, output = _spawn(cmd, env, cwd, timeout)
    busy1, wall1, own = _busy_cpu_s(), time.monotonic(), _children_cpu_s() - own0
    interference = None
    if busy0 is not None and busy1 is not None:
        interference = max(0.0, (busy1 - busy0 - own) / ((wall1 - wall0) * os.cpu_count()))
    return {"start": start, "code": code, "output": output, "interference": interference}


def _spawn(cmd: list[str], env: dict, cwd: Path, timeout: float) -> tuple[float, int, str]:
    try:
        import fcntl
        import pty
        import struct
        import termios
    except ImportError:  # Windows: plain pipes (progress bars then draw less)
        start = time.time()
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        return start, done.returncode, done.stdout + done.stderr
    import select

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    start = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
    )
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
    finally:
        os.close(master)
    code = proc.wait()
    return start, code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def _children_cpu_s() -> float:
    """CPU seconds used by this process's finished children (0 where unknown)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_cpu_s() -> float | None:
    """CPU seconds spent busy by the whole machine since boot (all CPUs, incl. steal)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def summarize(runs: dict[str, list[dict]], loops: list[str]) -> dict:
    """Medians over repeats. Ratios are paired: computed per repeat (runs close in time share
    the machine's state), then the median is taken."""
    med = statistics.median
    out: dict = {"loops": {}, "references": {}}
    for name in REFERENCES:
        out["references"][name] = med(r["start_to_first_step_s"] for r in runs[name])
    for name in loops:
        rows = runs[name]
        out["loops"][name] = {
            "samples_per_s": med(r["samples_per_s"] for r in rows),
            "samples_per_s_all": [r["samples_per_s"] for r in rows],
            "ms_per_step": med(r["ms_per_step"] for r in rows),
            "start_to_imports_s": med(r["start_to_imports_s"] for r in rows),
            "start_to_first_step_s": med(r["start_to_first_step_s"] for r in rows),
            "validation_cut_s": med(r["excluded_s"] for r in rows),
            "threads": rows[0]["threads"],
            "interference_all": [r["interference"] for r in rows],
        }

    def paired(a: str, b: str, key: str = "samples_per_s") -> list[float]:
        return [x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True)]

    ratios = {"b/a": paired("project", "minimal")}
    if "lightning" in loops:
        ratios["b/c"] = paired("project", "lightning")
    if "minimal_torch_default" in loops:
        ratios["a'/a"] = paired("minimal_torch_default", "minimal")
    out["ratios"] = {k: med(v) for k, v in ratios.items()}
    out["ratios_all"] = ratios
    torch_ref = [r["start_to_first_step_s"] for r in runs["import torch"]]
    out["startup_over_import_torch_s"] = {
        name: med(
            r["start_to_first_step_s"] - t for r, t in zip(runs[name], torch_ref, strict=True)
        )
        for name in loops
    }
    # The project's start-up beyond a hand-written loop's, paired per repeat: what the
    # project itself costs before its first step (both pay torch and torch._dynamo).
    out["startup_over_minimal_s"] = med(
        p["start_to_first_step_s"] - a["start_to_first_step_s"]
        for p, a in zip(runs["project"], runs["minimal"], strict=True)
    )
    return out


def report(res: dict) -> str:
    s, m = res["setup"], res["setup"]["machine"]
    noise = [x for row in res["loops"].values() for x in row["interference_all"] if x is not None]
    lines = [
        f"machine: {m['cpu']}, {m['cpus']} CPUs, {m['os']}; Python {m['python']}, "
        f"torch {m['torch']}, lightning {m['lightning'] or 'not installed'}",
        f"workload: {' '.join(s['overrides'])}; batch {s['batch_size']}, fp32, "
        f"{s['steps_per_epoch']} steps/epoch, {s['warmup_epochs']} warm-up epoch(s) left out, "
        f"{s['repeats']} repeat(s), torch threads {s['threads']}",
        "noise: other processes used "
        + (f"{statistics.median(noise):.0%} (median), {max(noise):.0%} (max)" if noise else "n/a")
        + f" of the CPUs during the runs; {s['retried_runs']} run(s) redone above "
        f"{s['noise_threshold']:.0%}; load average {s['loadavg_before']} before, "
        f"{s['loadavg_after']} after",
        "",
        "| loop | samples/s (median) | each repeat | ms/step | start to imports done "
        "| start to first step |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, row in res["loops"].items():
        every = ", ".join(f"{v:.0f}" for v in row["samples_per_s_all"])
        lines.append(
            f"| {LABELS[name]} | {row['samples_per_s']:.0f} | {every} | "
            f"{row['ms_per_step']:.2f} | {row['start_to_imports_s']:.2f} s | "
            f"{row['start_to_first_step_s']:.2f} s |"
        )
    for name, value in res["references"].items():
        lines.append(f'| `python -c "{name}"` (reference) | | | | {value:.2f} s | |')
    lines.append("")
    for key, value in res["ratios"].items():
        every = ", ".join(f"{v:.3f}" for v in res["ratios_all"][key])
        target = TARGETS.get(key)
        verdict = (
            f" (target >= {target}: {'met' if value >= target else 'MISSED'})" if target else ""
        )
        lines.append(f"{key} = {value:.3f}{verdict}; each repeat: {every}")
    for name, value in res["startup_over_import_torch_s"].items():
        target = TARGETS["startup_s"]
        verdict = f" (target <= {target:.0f} s: {'met' if value <= target else 'MISSED'})"
        lines.append(
            f"{LABELS[name]}: first step {value:+.2f} s after `import torch`"
            + (verdict if name == "project" else "")
        )
    over, target = res["startup_over_minimal_s"], TARGETS["startup_over_minimal_s"]
    lines.append(
        f"{LABELS['project']}: first step {over:+.2f} s after the minimal loop's "
        f"(target <= {target} s: {'met' if over <= target else 'MISSED'})"
    )
    return "\n".join(lines)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": _cpu_count(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "lightning": _version("lightning"),
    }


def _child_env(project: Path, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _has_lightning() -> bool:
    return importlib.util.find_spec("lightning") is not None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


if __name__ == "__main__":
    raise SystemExit(main())
