"""Launch the baked project's 2-rank CPU torchrun run many times, under CPU load, and count
the launches that fail (an exit code other than 0, or a signal, abort or traceback in the
output). For failures that show only under load or with unlucky timing, such as a rank lost to
SIGABRT at exit.

    python benchmarks/stress_torchrun.py                      # 30 launches, 3 busy loops
    python benchmarks/stress_torchrun.py --launches 150 --load 4 --parallel 2 --debug
    python benchmarks/stress_torchrun.py --project /tmp/sig/my-pytorch-project --launches 5
    python benchmarks/stress_torchrun.py --launches 2 --load 0    # what the slow test runs

Bakes the template (env_manager=none, run_smoke_test=no, init_git=no) into a temporary folder
unless --project names a bake. Each launch is

    python -m torch.distributed.run --standalone --nproc_per_node=2 scripts/train.py \\
        --config configs/experiments/smoke.yaml run.name=ddp run.output_dir=<fresh folder>

with the default config instead every --default-every launches. --load starts that many
`while True: pass` processes for the whole stress run; --parallel runs launches side by side.
--debug sets PYTHONFAULTHANDLER=1, TORCH_SHOW_CPP_STACKTRACES=1 and TORCH_CPP_LOG_LEVEL=INFO
in the ranks so an abort shows its Python and C++ stacks; the output of every failed launch
is kept under --logs. Prints "N launches, F failures" and each distinct failure signature;
exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent
FAST = {"env_manager": "none", "run_smoke_test": "no", "init_git": "no", "preset": "full"}
# The baked project's own tiny config (the smoke test's), so the two cannot drift apart.
SMALL = ["--config", "configs/experiments/smoke.yaml", "run.device=cpu"]
DEFAULT = ["train.epochs=2", "run.device=cpu"]
# Lines that mark a failed launch even when every exit code was 0.
BAD = re.compile(
    r"Signal \d+|SIG[A-Z]+|Aborted|abort\(|terminate called|Traceback|Fatal Python error"
    r"|core dumped|ChildFailedError|exitcode\s*:\s*-?[1-9]",
)
DEBUG_ENV = {
    "PYTHONFAULTHANDLER": "1",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
    "TORCH_CPP_LOG_LEVEL": "INFO",
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stress-torchrun-") as tmp:
        work = Path(tmp)
        project = Path(args.project).resolve() if args.project else bake(work)
        logs = Path(args.logs) if args.logs else work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = child_env(project, args.debug)
        load = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
        ]
        start = time.perf_counter()
        try:

            def one(i: int) -> dict:
                config = DEFAULT if args.default_every and i % args.default_every == 0 else SMALL
                return launch(i, project, work / "runs" / str(i), config, env, args, logs)

            with ThreadPoolExecutor(args.parallel) as pool:
                results = []
                for res in pool.map(one, range(1, args.launches + 1)):
                    results.append(res)
                    if res["failed"] or args.verbose:
                        status = "FAIL" if res["failed"] else "ok"
                        print(
                            f"launch {res['launch']}: {status} rc={res['rc']} "
                            f"{res['seconds']:.1f}s {res['config']}"
                            + (f" -> {res['log']}" if res["failed"] else ""),
                            flush=True,
                        )
        finally:
            for proc in load:
                proc.kill()
                proc.wait()
        elapsed = time.perf_counter() - start
    failures = [r for r in results if r["failed"]]
    signatures = collections.Counter(sig for r in failures for sig in r["signatures"] or ["?"])
    print(
        f"{len(results)} launches, {len(failures)} failures "
        f"(load {args.load}, parallel {args.parallel}, {elapsed:.0f}s, "
        f"{statistics_line(results)})"
    )
    for sig, n in signatures.most_common():
        print(f"  {n:4d} x {sig}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "results": results, "elapsed_s": elapsed}, indent=2)
        )
    return 1 if failures else 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=30)
    p.add_argument("--load", type=int, default=3, help="busy-loop processes (default 3)")
    p.add_argument("--parallel", type=int, default=1, help="launches side by side")
    p.add_argument(
        "--default-every", type=int, default=10, help="default config every N launches (0: never)"
    )
    p.add_argument("--project", help="an existing bake (default: bake the template)")
    p.add_argument("--debug", action="store_true", help="faulthandler and C++ stacks in ranks")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch")
    p.add_argument("--logs", help="keep failed launches' output here (default: temporary)")
    p.add_argument("--json", help="write every launch's result here")
    p.add_argument("--verbose", action="store_true", help="a line per launch, not only failures")
    p.add_argument("overrides", nargs="*", help="key=value added to every launch")
    return p.parse_args(argv)


def bake(work: Path) -> Path:
    from cookiecutter.main import cookiecutter

    return Path(
        cookiecutter(str(TEMPLATE), no_input=True, extra_context=FAST, output_dir=str(work))
    )


def child_env(project: Path, debug: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(project), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    if debug:
        env.update(DEBUG_ENV)
    return env


def launch(i: int, project: Path, out: Path, config, env, args, logs: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "scripts/train.py",
        *config,
        "run.name=ddp",
        *args.overrides,
        f"run.output_dir={out}",
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd,
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=args.timeout,
        )
        rc, text = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        out_text = exc.stdout or ""
        rc, text = "timeout", out_text if isinstance(out_text, str) else out_text.decode()
    seconds = time.perf_counter() - start
    sigs = signatures(text)
    failed = rc != 0 or bool(sigs)
    log = None
    if failed:
        log = logs / f"launch-{i:04d}.log"
        log.write_text(" ".join(cmd) + f"\nrc={rc}\n\n" + text)
    name = "default" if config is DEFAULT else "small"
    return {
        "launch": i,
        "rc": rc,
        "seconds": seconds,
        "config": name,
        "failed": failed,
        "signatures": sigs,
        "log": str(log) if log else None,
    }


def signatures(text: str) -> list[str]:
    """The distinct failure lines of one launch, with pids, addresses, times and paths of
    temporary folders blanked so that the same failure reads the same in every launch."""
    out = []
    for line in text.splitlines():
        if "[I" in line[:4] or not BAD.search(line):  # c10d INFO lines (with --debug)
            continue
        line = re.sub(r"0x[0-9a-f]+", "0x_", line)
        line = re.sub(r"\d{4}-\d\d-\d\d[_ T][\d:.,]+", "<time>", line)
        line = re.sub(r"/tmp/\S+", "<tmp>", line)
        line = re.sub(r"\b\d{3,}\b", "N", line)
        line = line.strip()[:160]
        if line not in out:
            out.append(line)
    return out


def statistics_line(results: list[dict]) -> str:
    secs = sorted(r["seconds"] for r in results)
    return f"median launch {secs[len(secs) // 2]:.1f}s, max {secs[-1]:.1f}s" if secs else "-"


if __name__ == "__main__":
    sys.exit(main())
