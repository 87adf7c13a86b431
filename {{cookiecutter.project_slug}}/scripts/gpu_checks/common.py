"""What every check uses: the machine it runs on, the processes a check starts (each in a
process group of its own, so that stopping the check stops its ranks and loader workers too),
the warnings in their output, and the figures and targets a check reports."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from {{ cookiecutter.package_name }}.distributed import BACKEND_VARIABLE
from {{ cookiecutter.package_name }}.errors import EXIT_STOPPED

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
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
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
__all__ = ["EXIT_STOPPED", "ROOT", "TINY", "Check", "Failed", "Machine", "OutOfBudget", "Skipped"]

# A warning in a run's output: Python's ("...: UserWarning: ..."), torch's C++ and logging
# lines ("[W1203 12:00:00.000 ...]", "W1203 12:00:00.000000 ...", with "[rank0]:"), and the
# project's own ("warning: ...").
WARNING = re.compile(
    r"\b[A-Z]\w*Warning\b[:(]|\bWarning: |^(\[rank\d+\]:)?\[?W\d{4} \d\d:\d\d:\d\d"
    r"|^warning: "
)
# torchrun's own notices, not the project's: the SIGTERM it forwards to its ranks (which the
# checks send), the OMP_NUM_THREADS=1 it gives each rank when the variable is unset.
TORCHRUN_NOTICE = re.compile(r"torch/distributed/(run\.py|elastic/)")


class Failed(Exception):
    """The check failed: args[0] is the one-line detail, `output` the end of the log and
    `command` the command that failed (run from the project root)."""

    def __init__(self, detail: str, output: str = "", command: str = ""):
        super().__init__(detail)
        self.output, self.command = output, command


class Skipped(Exception):
    pass


class OutOfBudget(Exception):
    """--budget ended while the check ran (its deadline was the budget's end, not its own
    limit): the check is not run, not failed."""


@dataclass(frozen=True)
class Machine:
    device: str  # "cuda", or "cpu" (--allow-cpu without a GPU)
    gpus: int
    capability: tuple[int, int] | None  # compute capability of cuda:0
    name: str = "cpu"  # cuda:0's name

    @property
    def native_bf16(self) -> bool:
        # Ampere (8.0) and newer have bf16 tensor cores; torch.cuda.is_bf16_supported() also
        # counts the slow emulation on V100/T4.
        return self.device == "cpu" or (self.capability is not None and self.capability[0] >= 8)

    def backend(self, ranks: int) -> str:
        """What `ranks` ranks talk over: NCCL with a GPU each; gloo where they share one GPU
        (NCCL refuses that) or on the CPU."""
        if self.device != "cuda":
            return "gloo"
        return "nccl" if self.gpus >= ranks else "gloo"


@dataclass
class Check:
    """One check in progress: its machine, its own folder, its deadline, what it started and
    what it measured."""

    machine: Machine
    workdir: Path
    deadline: float  # time.monotonic() by which the whole check must be done
    budget_end: bool = False  # the deadline is --budget's end, before the check's own limit
    started: list[subprocess.Popen] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    targets: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)

    def overrides(self, name: str, *more: str) -> list[str]:
        """TINY on this device, writing run `name` under the check's folder."""
        device, runs = self.machine.device, self.workdir / "runs"
        return [*TINY, f"run.device={device}", f"run.output_dir={runs}", f"run.name={name}", *more]

    def run_dir(self, name: str) -> Path:
        return self.workdir / "runs" / name

    def launch(self, ranks: int) -> tuple[list[str], dict]:
        """The command that starts scripts/train.py on `ranks` ranks, and its environment:
        torchrun for more than one, over gloo where the ranks share a GPU."""
        if ranks == 1:
            return [sys.executable, "scripts/train.py"], {}
        shared = self.machine.device == "cuda" and self.machine.backend(ranks) == "gloo"
        env = {BACKEND_VARIABLE: "gloo"} if shared else {}
        return [*TORCHRUN, f"--nproc_per_node={ranks}", "scripts/train.py"], env

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """`args` from the project root, in a process group of its own (so that a timeout or
        a signal reaches its loader workers and ranks too); stdout+stderr go to a log file."""
        paths = [str(ROOT), str(SCRIPTS), *filter(None, [os.environ.get("PYTHONPATH")])]
        extra = {k: str(v) for k, v in (env or {}).items()}
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
        log = self.workdir / f"{len(list(self.workdir.glob('*.log'))) + 1}.log"
        command = " ".join(
            [*(f"{k}={shlex.quote(v)}" for k, v in extra.items()), shlex.join(args)]
        )
        with log.open("w") as out:
            out.write(f"$ {command}\n")
            out.flush()
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**full, **extra},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log, proc.command = log, command
        self.started.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, expect: int | None = 0) -> str:
        """Wait for `proc` (killing its group at the deadline); its output, or Failed.
        `expect`: the exit code it must end with; None for any."""
        try:
            code = proc.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill_all()
            if self.budget_end:
                raise OutOfBudget(f"--budget spent while it ran: {proc.command}") from None
            what = f"timed out (see --timeout): {proc.command}"
            raise Failed(what, tail(proc.log), proc.command) from None
        output = proc.log.read_text(errors="replace")
        self.note_warnings(output, proc.command)
        if expect is not None and code != expect:
            last = (output.strip().splitlines() or [""])[-1][:120]
            raise Failed(f"exit {code} (expected {expect}): {last}", tail(proc.log), proc.command)
        return output

    def run(self, *args: str, expect: int | None = 0, env: dict | None = None) -> str:
        return self.wait(self.start(*args, env=env), expect)

    def python(self, *args: str, expect: int | None = 0, env: dict | None = None) -> str:
        return self.run(sys.executable, *args, expect=expect, env=env)

    def kill_all(self) -> None:
        """Stop what this check started and is still running, ranks and loader workers too."""
        for proc in self.started:
            if proc.poll() is None:  # not reaped yet, so its group id is still its own
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def note_warnings(self, output: str, command: str) -> None:
        for line in output.splitlines():
            if not WARNING.search(line) or TORCHRUN_NOTICE.search(line):
                continue
            if not any(w["line"] == line.strip()[:300] for w in self.warnings):
                self.warnings.append({"line": line.strip()[:300], "command": command})

    def target(
        self, name: str, value: float, goal: float, at_most: bool = False, judged: bool = False
    ) -> None:
        """A figure measured against its target (value >= goal, or <= with at_most). Judged
        on CUDA, and on the CPU too when `judged` (a numeric tolerance; a speed is not)."""
        judged = judged or self.machine.device == "cuda"
        ok = (value <= goal) if at_most else (value >= goal)
        self.targets.append(
            {
                "check": self.workdir.name,
                "name": name,
                "value": value,
                "target": f"{'<=' if at_most else '>='} {goal:g}",
                "pass": ok if judged else None,
            }
        )

    def in_worker(self, name: str) -> str:
        """Run check `name` in a child interpreter (a CUDA error, a leak or a global flag stays
        there) and take its detail, figures, targets and warnings."""
        result = self.workdir / "worker.json"
        cpu = ["--allow-cpu"] if self.machine.device == "cpu" else []
        args = ["--worker", name, "--result", str(result), "--workdir", str(self.workdir)]
        self.python("scripts/gpu_check.py", *args, *cpu)
        done = json.loads(result.read_text())
        self.figures.update(done["figures"])
        self.targets.extend(done["targets"])
        self.warnings.extend(w for w in done["warnings"] if w not in self.warnings)
        if done["status"] == "skip":
            raise Skipped(done["detail"])
        if done["status"] == "FAIL":
            raise Failed(done["detail"], done.get("output", ""), done.get("command", ""))
        return done["detail"]


def tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def load_last(run_dir: Path) -> dict:
    path = run_dir / "last.pt"
    if not path.exists():
        raise Failed(f"no {path.name} in {run_dir.name}/")
    return torch.load(path, map_location="cpu", weights_only=True)


def distance(a: dict, b: dict) -> float:
    """sum |a - b| / sum |b| over the floating-point tensors of two state dicts, BatchNorm's
    running statistics left out (a training step moves them whatever the lr)."""
    keys = [k for k in b if b[k].is_floating_point() and "running_" not in k]
    diff = sum((a[k].double() - b[k].double()).abs().sum().item() for k in keys)
    return diff / max(sum(b[k].double().abs().sum().item() for k in keys), 1e-12)


def flat(state, prefix: str = "") -> dict:
    """A checkpoint's nested dicts and lists as {"optimizer.state.0.exp_avg": value}."""
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return {prefix: state}
    named = ((f"{prefix}.{key}" if prefix else str(key), value) for key, value in items)
    return {k: v for name, value in named for k, v in flat(value, name).items()}


def compare_states(a: dict, b: dict, parts: tuple[str, ...]) -> int:
    """How many entries of `parts` ("model", "optimizer") two checkpoints hold, all bitwise
    equal (tensors by torch.equal, with their dtypes; other values by ==); Failed naming how
    many differ and the first."""
    left = flat({p: a[p] for p in parts})
    right = flat({p: b[p] for p in parts})
    differ = [k for k in left if k not in right or not same(left[k], right[k])]
    differ += [k for k in right if k not in left]
    if differ:
        k = differ[0]
        gap = "in one of them only"
        if k in left and k in right:
            x, y = left[k], right[k]
            tensors = torch.is_tensor(x) and torch.is_tensor(y)
            gap = tensor_gap(x, y) if tensors else f"{x!r} against {y!r}"
        what = " and ".join(parts)
        raise Failed(f"{len(differ)}/{len(left)} entries of {what} differ (first {k}: {gap})")
    return len(left)


def same(x, y) -> bool:
    if torch.is_tensor(x) or torch.is_tensor(y):
        tensors = torch.is_tensor(x) and torch.is_tensor(y)
        return tensors and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    return x == y


def tensor_gap(x: torch.Tensor, y: torch.Tensor) -> str:
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"{x.dtype} {tuple(x.shape)} against {y.dtype} {tuple(y.shape)}"
    gap = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
    return f"max |diff| {gap:.1e}"


def last_epoch_line(output: str) -> str:
    epochs = [line for line in output.splitlines() if line.startswith("epoch ")]
    return epochs[-1].split(" | lr")[0] if epochs else "no epoch line"


def pytest_summary(output: str) -> str:
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|deselected).*?)\s*=*$", output, re.M)
    return found[-1] if found else "no summary line"
