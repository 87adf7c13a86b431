"""GPU check: the project's GPU paths end to end on this machine, then a pass/fail table.

    python scripts/gpu_check.py                  # or: make gpu-check (a few minutes on a GPU)
    python scripts/gpu_check.py --list           # the checks and what each one runs
    python scripts/gpu_check.py --only resume,bf16 --keep --timeout 900
    python scripts/gpu_check.py --allow-cpu      # no GPU: the same checks on CPU where they mean
                                                 # something (how the test suite runs it)

Each check runs the project's own commands (scripts/*.py, pytest, torchrun) as subprocesses on
tiny settings in a temporary folder (kept with --keep) and reports pass, fail or skip with one
line of detail; a failing check also prints the end of its output. Exit codes: 0 no check
failed, 1 at least one failed, 2 no CUDA GPU (without --allow-cpu) or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# Small enough for seconds per run on a GPU (and on CPU), big enough to learn something.
TINY = [
    "data.train_size=512",
    "data.val_size=128",
    "data.image_size=8",
    "data.num_classes=4",
    "model.width=8",
    "train.batch_size=32",
    "train.epochs=2",
    "train.warmup_steps=2",
    "run.log_every=4",
    "run.loggers=[csv]",
]
STEPS_PER_EPOCH = 512 // 32
EXIT_PREEMPTED = 75  # what scripts/train.py returns after saving on SIGTERM


class Failed(Exception):
    """The check failed: args[0] is the one-line detail, `output` the end of the log."""

    def __init__(self, detail: str, output: str = ""):
        super().__init__(detail)
        self.output = output


class Skipped(Exception):
    pass


@dataclass
class Machine:
    device: str  # "cuda" or "cpu" (--allow-cpu without a GPU)
    gpus: int
    capability: tuple[int, int] | None  # compute capability of cuda:0

    @property
    def native_bf16(self) -> bool:
        # Ampere (8.0) and newer have bf16 tensor cores; torch.cuda.is_bf16_supported() also
        # counts the slow emulation on V100/T4.
        return self.capability is not None and self.capability[0] >= 8


@dataclass
class Check:
    machine: Machine
    workdir: Path  # this check's own folder
    deadline: float  # time.monotonic() by which the whole check must be done
    started: list[subprocess.Popen] = field(default_factory=list)

    def overrides(self, name: str, *more: str) -> list[str]:
        """TINY on this device, writing run `name` under the check's folder."""
        device, runs = self.machine.device, self.workdir / "runs"
        return [*TINY, f"run.device={device}", f"run.output_dir={runs}", f"run.name={name}", *more]

    def run_dir(self, name: str) -> Path:
        return self.workdir / "runs" / name

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """`args` from the project root, in a process group of its own (so that a timeout or
        a signal reaches its loader workers and ranks too); stdout+stderr go to a log file."""
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(env or {})}
        log = self.workdir / f"{len(list(self.workdir.glob('*.log'))) + 1}.log"
        with log.open("w") as out:
            out.write(f"$ {' '.join(args)}\n")
            out.flush()
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log = log
        self.started.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, expect: int | None = 0) -> str:
        """Wait for `proc` (killing its group at the deadline); its output, or Failed.
        `expect`: the exit code it must end with; None for any."""
        try:
            code = proc.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill_all()
            command = " ".join(proc.args[1:3])
            raise Failed(f"timed out (see --timeout): {command}", tail(proc.log)) from None
        output = proc.log.read_text(errors="replace")
        if expect is not None and code != expect:
            last = output.strip().splitlines()[-1][:120]
            raise Failed(f"exit {code} (expected {expect}): {last}", tail(proc.log))
        return output

    def run(self, *args: str, expect: int = 0, env: dict | None = None) -> str:
        return self.wait(self.start(*args, env=env), expect)

    def kill_all(self) -> None:
        """Stop what this check started and is still running, ranks and loader workers too."""
        for proc in self.started:
            if proc.poll() is None:  # not reaped yet, so its group id is still its own
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def python(self, *args: str, expect: int = 0, env: dict | None = None) -> str:
        return self.run(sys.executable, *args, expect=expect, env=env)


def tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def load_last(run_dir: Path) -> dict:
    path = run_dir / "last.pt"
    if not path.exists():
        raise Failed(f"no {path.name} in {run_dir.name}/")
    return torch.load(path, map_location="cpu", weights_only=True)


# ---- the checks, in the order they run ----


def check_tests(c: Check) -> str:
    """pytest tests/test_cuda.py, plus tests marked `cuda` elsewhere."""
    # Every test of the file, the slow ones too (pyproject's addopts deselect them).
    options = ("-q", "-rs", "-p", "no:cacheprovider", "-m", "slow or not slow")
    out = c.python("-m", "pytest", *options, "tests/test_cuda.py")
    summary = [pytest_summary(out)]
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    files = [f"tests/{p.name}" for p in tests if "mark.cuda" in p.read_text()]
    if files := [f for f in files if f != "tests/test_cuda.py"]:
        out = c.python("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "cuda", *files)
        summary.append(f"marked cuda: {pytest_summary(out)}")
    return "; ".join(summary)


def pytest_summary(output: str) -> str:
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|deselected).*?)\s*=*$", output, re.M)
    return found[-1] if found else "no summary line"


# scripts/train.py stopping after step argv[1] as SIGTERM does (saved where it is, exit 75),
# at that step for certain; with run.log_every=1 the stop is seen at every step. (A stop by
# train.max_steps ends the run: its lr schedule ends there.)
STOPPING_TRAIN = """
import sys
from {{ cookiecutter.package_name }} import loop
from {{ cookiecutter.package_name }}.tools.train import train_main
stop, read = int(sys.argv[1]), loop.read_losses
def read_losses(run, *args):
    if run.progress.step == stop:
        run.stop.reason = "SIGTERM"
    return read(run, *args)
loop.read_losses = read_losses
raise SystemExit(train_main(sys.argv[2:]))
"""


def check_resume(c: Check) -> str:
    """3 epochs straight vs stopped mid-epoch 2 (as by SIGTERM) and resumed: last.pt bitwise."""
    exact = ["run.deterministic=true", "train.epochs=3"]
    c.python("scripts/train.py", *c.overrides("straight", *exact))
    stop_at = STEPS_PER_EPOCH * 3 // 2
    stopping = c.overrides("resumed", *exact, "run.log_every=1")
    c.python("-c", STOPPING_TRAIN, str(stop_at), *stopping, expect=EXIT_PREEMPTED)
    c.python("scripts/train.py", *c.overrides("resumed", *exact, "train.resume=auto"))
    straight, resumed = load_last(c.run_dir("straight")), load_last(c.run_dir("resumed"))
    steps = straight["progress"]["step"], resumed["progress"]["step"]
    if steps[0] != steps[1]:
        raise Failed(f"the resumed run ended at step {steps[1]}, the straight one at {steps[0]}")
    a, b = straight["model"], resumed["model"]
    differ = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
    if differ:
        k = differ[0]
        diff = (a[k].double() - b[k].double()).abs().max().item() if k in b else "missing"
        raise Failed(
            f"{len(differ)}/{len(a)} tensors differ after resume at step {stop_at} "
            f"(first {k}: max abs diff {diff})"
        )
    return f"{len(a)} tensors bitwise equal at step {steps[0]} (stopped at {stop_at}, resumed)"


def amp_run(c: Check, amp: str) -> str:
    if c.machine.device != "cuda":
        raise Skipped(f"{amp} autocast is checked on CUDA only")
    out = c.python("scripts/train.py", *c.overrides(amp, f"train.amp={amp}"))
    state = load_last(c.run_dir(amp))
    scaled = bool(state["scaler"])  # fp16 needs a GradScaler; bf16 must not use one
    if scaled != (amp == "fp16"):
        raise Failed(f"GradScaler {'on' if scaled else 'off'} with train.amp={amp}")
    return last_epoch_line(out)


def last_epoch_line(output: str) -> str:
    epochs = [line for line in output.splitlines() if line.startswith("epoch ")]
    return epochs[-1].split(" | lr")[0] if epochs else "no epoch line"


def check_bf16(c: Check) -> str:
    """train.amp=bf16 (skipped below compute capability 8.0, where bf16 is emulated)."""
    if c.machine.device == "cuda" and not c.machine.native_bf16:
        major, minor = c.machine.capability
        raise Skipped(f"compute capability {major}.{minor} < 8.0: no native bf16 (use fp16)")
    return amp_run(c, "bf16")


def check_fp16(c: Check) -> str:
    """train.amp=fp16 with its GradScaler."""
    return amp_run(c, "fp16")


def check_compile(c: Check) -> str:
    """train.compile=true for a few steps, then evaluate the checkpoint (plain keys)."""
    c.python(
        "scripts/train.py", *c.overrides("compiled", "train.compile=true", "train.max_steps=8")
    )
    last = str(c.run_dir("compiled") / "last.pt")
    out = c.python("scripts/evaluate.py", "--checkpoint", last, "--json")
    metrics = json.loads(next(line for line in out.splitlines()[::-1] if line.startswith("{")))
    return f"8 compiled steps; evaluate: val loss {metrics['loss']:.3f} acc {metrics['acc']:.3f}"


def check_distributed(c: Check) -> str:
    """torchrun: 2 ranks (nccl) with 2+ GPUs, else 1; 2 ranks on gloo with --allow-cpu."""
    ranks = 2 if c.machine.device == "cpu" or c.machine.gpus >= 2 else 1
    backend = "nccl" if c.machine.device == "cuda" else "gloo"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    c.run(*torchrun, f"--nproc_per_node={ranks}", "scripts/train.py", *c.overrides("ddp"))
    world = load_last(c.run_dir("ddp"))["meta"]["world_size"]
    if world != ranks:
        raise Failed(f"last.pt says world size {world}, expected {ranks}")
    return f"{ranks} rank(s) on {backend}, world size {world} in last.pt"


def check_preemption(c: Check) -> str:
    """SIGTERM to train.py and its 2 loader workers after the first checkpoint: exit 75 with
    last.pt; then train.resume=auto runs to the end."""
    long, total = long_run(c, ranks=1)
    args = c.overrides("preempted", "data.num_workers=2", *long)
    stopped = stop_and_resume(c, [sys.executable, "scripts/train.py"], "preempted", args, total)
    return f"SIGTERM -> exit 75 at step {stopped}; resumed to step {total}"


def long_run(c: Check, ranks: int) -> tuple[list[str], int]:
    """Overrides for a run long enough to be stopped mid-run, and its steps on `ranks` ranks:
    8 epochs, so the stop, sent when epoch 1's checkpoint appears, has 7 epochs to land in.
    2048 samples an epoch on CUDA; on the CPU (--allow-cpu, how the test suite runs it) TINY's
    512, a quarter of the training for the same margin in epochs."""
    samples = 2048 if c.machine.device == "cuda" else 512
    return [f"data.train_size={samples}", "train.epochs=8"], samples // (32 * ranks) * 8


def stop_and_resume(c: Check, launch: list[str], run: str, args: list[str], total: int) -> int:
    """Start `launch` + `args`, SIGTERM its process group after run `run`'s first checkpoint,
    check it saved and stopped inside its `total` steps, resume it to the end. Returns the step
    it stopped at. Under torchrun only the ranks' exit code (75) is checked, in their output."""
    proc = c.start(*launch, *args)
    torchrun = "torch.distributed.run" in launch
    expect = None if torchrun else EXIT_PREEMPTED
    while not list(c.run_dir(run).glob("step-*.pt")):
        if proc.poll() is not None or time.monotonic() > c.deadline:
            c.wait(proc, expect=expect)  # reports the exit code or the timeout
            raise Failed("no step-*.pt was written before the run ended")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)  # as schedulers do: the whole process group
    output = c.wait(proc, expect=expect)
    stopped = load_last(c.run_dir(run))["progress"]["step"]
    if f"stopped (SIGTERM) at step {stopped}" not in output:
        raise Failed(f"no 'stopped (SIGTERM) at step {stopped}' line", tail(proc.log))
    if not 0 < stopped < total:
        raise Failed(f"last.pt is at step {stopped}, not inside the run's {total} steps")
    c.run(*launch, *args, "train.resume=auto")
    final = load_last(c.run_dir(run))["progress"]["step"]
    if final != total:
        raise Failed(f"the resumed run ended at step {final}, expected {total}")
    return stopped


def launches(c: Check, one: bool = True) -> list[tuple[int, list[str]]]:
    """(ranks, command) that run scripts/train.py: one process (unless not `one`), and torchrun
    with 2 ranks where there are 2+ GPUs (NCCL gives each rank its own), or on the CPU."""
    found = [(1, [sys.executable, "scripts/train.py"])] if one else []
    if c.machine.device == "cpu" or c.machine.gpus >= 2:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        found.append((2, [*torchrun, "--nproc_per_node=2", "scripts/train.py"]))
    return found


def backend(c: Check) -> str:
    return "nccl" if c.machine.device == "cuda" else "gloo"


def check_fsdp(c: Check) -> str:
    """train.strategy=fsdp on one process (a one-rank group) and on 2 ranks (2+ GPUs): each
    stopped by SIGTERM after its first checkpoint, then resumed to the end."""
    done = []
    for ranks, launch in launches(c):
        run, (long, total) = f"fsdp{ranks}", long_run(c, ranks)
        args = c.overrides(run, "train.strategy=fsdp", *long)
        stopped = stop_and_resume(c, launch, run, args, total)
        world = load_last(c.run_dir(run))["meta"]["world_size"]
        if world != ranks:
            raise Failed(f"{run}: last.pt says world size {world}, expected {ranks}")
        done.append(f"{ranks} rank(s) stopped at step {stopped}, resumed to {total}")
    return f"{backend(c)}: " + "; ".join(done)


def check_fsdp_bf16(c: Check) -> str:
    """train.strategy=fsdp with train.amp=bf16 on the default CNN (BatchNorm kept in fp32)."""
    if c.machine.device == "cuda" and not c.machine.native_bf16:
        raise Skipped("no native bf16 (compute capability < 8.0)")
    args = c.overrides("fsdp_bf16", "train.strategy=fsdp", "train.amp=bf16")
    return last_epoch_line(c.python("scripts/train.py", *args))


def check_cpu_offload(c: Check) -> str:
    """train.strategy=fsdp with train.cpu_offload=true (shards and optimizer step in CPU
    memory, gradient norm all-reduced on the CPU), on one process and on 2 ranks (2+ GPUs)."""
    if c.machine.device != "cuda":
        raise Skipped("train.cpu_offload needs CUDA GPUs (refused on the CPU)")
    done = []
    for ranks, launch in launches(c):
        args = c.overrides(f"offload{ranks}", "train.strategy=fsdp", "train.cpu_offload=true")
        done.append(f"{ranks} rank(s): {last_epoch_line(c.run(*launch, *args))}")
    return "; ".join(done)


def check_compile_ddp(c: Check) -> str:
    """train.compile=true in DistributedDataParallel: torchrun, 2 ranks (2+ GPUs)."""
    found = launches(c, one=False)
    if not found:
        raise Skipped("ddp needs 2+ GPUs (one process does not wrap the model; see compile)")
    _, launch = found[0]
    out = c.run(*launch, *c.overrides("compile_ddp", "train.compile=true", "train.max_steps=8"))
    return f"2 ranks on {backend(c)}: {last_epoch_line(out)}"


def check_compile_fsdp(c: Check) -> str:
    """train.compile=true with train.strategy=fsdp, one process and 2 ranks (2+ GPUs)."""
    done = []
    for ranks, launch in launches(c):
        args = ["train.strategy=fsdp", "train.compile=true", "train.max_steps=8"]
        out = c.run(*launch, *c.overrides(f"compile_fsdp{ranks}", *args))
        done.append(f"{ranks} rank(s): {last_epoch_line(out)}")
    return "; ".join(done)


def check_channels_last(c: Check) -> str:
    """train.channels_last=true with ddp and with fsdp (weights sharded in the default
    layout, inputs channels_last)."""
    done = []
    for strategy in ("ddp", "fsdp"):
        args = [f"train.strategy={strategy}", "train.channels_last=true"]
        out = c.python("scripts/train.py", *c.overrides(f"channels_last_{strategy}", *args))
        done.append(f"{strategy}: {last_epoch_line(out)}")
    return "; ".join(done)


def check_init_from(c: Check) -> str:
    """train.init_from=<best.pt> with train.resume=auto on a new run (as SLURM and sweeps pass
    it) starts from those weights: after one step at a negligible lr they are best.pt's, unlike
    a fresh run's."""
    c.python("scripts/train.py", *c.overrides("base"))
    best = c.run_dir("base") / "best.pt"
    one_step = ["train.max_steps=1", "train.resume=auto", "train.lr=1e-9"]
    c.python("scripts/train.py", *c.overrides("tuned", f"train.init_from={best}", *one_step))
    c.python("scripts/train.py", *c.overrides("fresh", *one_step))
    base = torch.load(best, map_location="cpu", weights_only=True)["model"]
    tuned, fresh = (load_last(c.run_dir(name))["model"] for name in ("tuned", "fresh"))
    moved, apart = distance(tuned, base), distance(fresh, base)
    if not moved < apart / 10:
        raise Failed(
            f"after one step the init_from run is {moved:.3f} from best.pt (a fresh run "
            f"{apart:.3f}): its weights were not loaded"
        )
    return f"one step from best.pt: {moved:.4f} relative distance (a fresh run: {apart:.3f})"


def distance(a: dict, b: dict) -> float:
    """sum |a - b| / sum |b| over the floating-point tensors of two state dicts, BatchNorm's
    running statistics left out (a training step moves them whatever the lr)."""
    keys = [k for k in b if b[k].is_floating_point() and "running_" not in k]
    diff = sum((a[k].double() - b[k].double()).abs().sum().item() for k in keys)
    return diff / max(sum(b[k].double().abs().sum().item() for k in keys), 1e-12)


def check_sweep_gpus(c: Check) -> str:
    """scripts/sweep.py --parallel 2: two trials at a time, each on a GPU of its own (both on
    GPU 0 with one GPU)."""
    if c.machine.device != "cuda":
        raise Skipped("--parallel on the CPU splits CPU threads (the test suite covers it)")
    args = [a for a in c.overrides("unused", "train.epochs=1") if not a.startswith("run.name")]
    c.python("scripts/sweep.py", "--name", "sweep", "--parallel", "2", "train.lr=1e-3,2e-3", *args)
    sweep = c.workdir / "runs" / "sweep"
    trials = json.loads((sweep / "sweep.json").read_text())["trials"]
    states = [t["state"] for t in trials]
    if states != ["done", "done"]:
        raise Failed(f"trial states {states}, expected done, done")
    logs = [(sweep / "logs" / f"{t['id']}.out").read_text(errors="replace") for t in trials]
    if not all(" | cuda" in log for log in logs):
        raise Failed("a trial's run line does not name a cuda device")
    return f"2 trials at a time on {min(c.machine.gpus, 2)} GPU(s): both done"


def check_combinations(c: Check) -> str:
    """tests/test_combinations.py on CUDA: every pair of option values, trained, stopped,
    resumed, evaluated and exported; fp16 and NCCL train here (the CPU refuses fp16 and runs
    gloo). Two-rank cases need 2 GPUs."""
    out = c.python(
        *("-m", "pytest", "-q", "-rs", "-x", "-p", "no:cacheprovider", "-m", "slow"),
        "tests/test_combinations.py",
        env={"COMBINATIONS_DEVICE": "cuda"},
    )
    return pytest_summary(out)


def check_smoke(c: Check) -> str:
    """scripts/smoke.py: train, checkpoint, resume, evaluate."""
    out = c.python("scripts/smoke.py", f"run.device={c.machine.device}")
    return next((line for line in out.splitlines() if line.startswith("smoke test passed")), "")


def check_benchmark(c: Check) -> str:
    """scripts/benchmark_gpu.py, quick settings: samples/s, MFU, peak memory per variant."""
    dtypes = ["fp32", "bf16"] if c.machine.device == "cpu" or c.machine.native_bf16 else ["fp32"]
    quick = ["--steps", "10", "--warmup", "3", "--repeats", "3", "--json", "--dtypes", *dtypes]
    settings = [f"run.device={c.machine.device}"]
    if c.machine.device == "cpu":  # the default model takes minutes per variant on a busy CPU
        settings += ["model.width=8", "data.image_size=8", "train.batch_size=32"]
    out = c.python("scripts/benchmark_gpu.py", *settings, *quick)
    lines = out.splitlines()  # the JSON, printed at once, among stderr's warning lines
    start = lines.index("{")
    end = len(lines) - lines[::-1].index("}")
    result = json.loads("\n".join(lines[start:end]))
    failed = [r for r in result["results"] if "error" in r]
    if failed:
        r = failed[0]
        raise Failed(f"{r['dtype']} compile {'on' if r['compile'] else 'off'}: {r['error']}")
    rows = ", ".join(
        f"{r['dtype']}{'+compile' if r['compile'] else ''} {r['samples_per_s']:.0f}/s"
        + (f" MFU {r['mfu']:.1%}" if r["mfu"] is not None else "")
        for r in result["results"]
    )
    memory = max((r["peak_memory_mb"] or 0) for r in result["results"])
    return f"{rows}" + (f"; peak {memory:.0f} MB" if memory else "")


CHECKS = {
    "tests": check_tests,
    "resume": check_resume,
    "bf16": check_bf16,
    "fp16": check_fp16,
    "compile": check_compile,
    "distributed": check_distributed,
    "preemption": check_preemption,
    "fsdp": check_fsdp,
    "fsdp_bf16": check_fsdp_bf16,
    "cpu_offload": check_cpu_offload,
    "compile_ddp": check_compile_ddp,
    "compile_fsdp": check_compile_fsdp,
    "channels_last": check_channels_last,
    "init_from": check_init_from,
    "sweep_gpus": check_sweep_gpus,
    "combinations": check_combinations,
    "smoke": check_smoke,
    "benchmark": check_benchmark,
}


# ---- running them ----


def find_machine() -> Machine | str:
    """This machine's GPUs, or why there are none to check."""
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        return Machine("cuda", gpus, tuple(torch.cuda.get_device_capability(0)))
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


def describe(machine: Machine) -> str:
    if machine.device == "cpu":
        return f"CPU only (--allow-cpu), torch {torch.__version__}"
    major, minor = machine.capability
    name = torch.cuda.get_device_name(0)
    return (
        f"{machine.gpus} x {name} (compute capability {major}.{minor}), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


def run_check(name: str, machine: Machine, workdir: Path, timeout: float) -> dict:
    workdir.mkdir(parents=True)
    start = time.monotonic()
    output, check = "", Check(machine, workdir, start + timeout)
    try:
        status, detail = "pass", CHECKS[name](check)
    except Skipped as exc:
        status, detail = "skip", str(exc)
    except Failed as exc:
        status, detail, output = "FAIL", str(exc), exc.output
    except Exception as exc:  # a bug or a surprise in the check itself is a failure too
        status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
    finally:  # also on Ctrl-C, which the subprocesses' own sessions do not receive
        check.kill_all()
    seconds = time.monotonic() - start
    print(f"{status} ({seconds:.1f}s)", flush=True)
    if output:
        print("\n".join(f"    | {line}" for line in output.splitlines()), flush=True)
    return {"check": name, "status": status, "seconds": seconds, "detail": detail}


def summary_table(results: list[dict]) -> str:
    width = max(len(r["check"]) for r in results)
    lines = [f"{'check':<{width}}  result   time  detail"]
    for r in results:
        row = f"{r['check']:<{width}}  {r['status']:<6} {r['seconds']:5.0f}s  {r['detail']}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="run only these checks")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per check (600)")
    parser.add_argument("--allow-cpu", action="store_true", help="without a GPU, run on CPU")
    args = parser.parse_args(argv)
    if args.list:
        width = max(map(len, CHECKS))
        for name, check in CHECKS.items():
            print(f"{name:<{width}}  {' '.join(check.__doc__.split())}")
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        parser.error(f"unknown check {unknown[0]!r}; the checks: {', '.join(CHECKS)}")
    machine = find_machine()
    if isinstance(machine, str):
        if not args.allow_cpu:
            print(
                f"no CUDA GPU visible: {machine}; `python scripts/doctor.py` says why "
                "(--allow-cpu runs the checks on CPU)"
            )
            return 2
        machine = Machine("cpu", 0, None)
    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    print(f"gpu check on {describe(machine)}; work folder {workdir}", flush=True)
    start, results = time.monotonic(), []
    try:
        for i, name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] {name} ... ", end="", flush=True)
            results.append(run_check(name, machine, workdir / name, args.timeout))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "FAIL", "skip")}
    print(f"\n{summary_table(results)}\n")
    kept = f"; outputs kept in {workdir}" if args.keep else ""
    print(
        f"gpu check: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped "
        f"in {time.monotonic() - start:.0f}s{kept}"
    )
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
