"""One-process paths, each through the project's own scripts as a user runs them: the tests
marked cuda, a default run, bitwise resume, compile with evaluate and predict, preemption with
loader workers, fsdp with bf16, channels_last, init_from, the tools' own runs, the smoke test."""  # feature: fsdp
loader workers, channels_last, init_from, the tools' own runs, the smoke test."""  # feature: !fsdp

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import sys
import time

import torch

from .common import (
    EXIT_STOPPED,
    ROOT,
    STEPS_PER_EPOCH,
    Check,
    Failed,
    Skipped,
    compare_states,
    distance,
    last_epoch_line,
    load_last,
    pytest_summary,
    tail,
)

COMPILE_ON_CPU = "compiling takes minutes on a busy CPU (tests/test_cuda.py compiles there)"


def check_tests(c: Check) -> str:
    """pytest -m cuda: the tests marked cuda in any file (tests/test_cuda.py: each AMP mode
    with channels_last and loader workers, a CUDA checkpoint resumed on the CPU, compile)."""
    if c.machine.device != "cuda":
        raise Skipped("the tests marked cuda need a GPU (the test suite runs them on CPU too)")
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    files = [f"tests/{p.name}" for p in tests if "mark.cuda" in p.read_text()]
    out = c.python("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "cuda", *files)
    summary = pytest_summary(out)
    if " passed" not in summary:
        raise Failed(f"no test marked cuda ran: {summary}", out[-3000:])
    return summary


def check_default_run(c: Check) -> str:
    """scripts/train.py with the defaults (one epoch of 1024 samples): what a user runs first:
    fp32 with TF32, pinned memory, csv and TensorBoard; the epoch line names peak memory and
    run.json the GPU, CUDA and cuDNN."""
    runs = c.workdir / "runs"
    samples = 1024 if c.machine.device == "cuda" else 256  # on the CPU: for the code only
    sizes = [f"data.train_size={samples}", "data.val_size=256", "train.epochs=1"]
    out = c.python("scripts/train.py", *sizes, f"run.output_dir={runs}")
    if c.machine.device == "cuda" and "cuda peak" not in out:
        raise Failed("the epoch line names no CUDA peak memory", out[-2000:])
    # run.json names the GPU and the CUDA build it trained with (utils/provenance.py).
    record = json.loads((runs / "default" / "run.json").read_text())
    gpus, cuda = record["machine"].get("gpus"), record["software"].get("cuda")
    if c.machine.device == "cuda" and not (gpus and cuda and record["software"].get("cudnn")):
        raise Failed("run.json names no GPU, CUDA or cuDNN", json.dumps(record)[:2000])
    return last_epoch_line(out)


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
    """3 epochs straight vs stopped mid-epoch 2 (as by SIGTERM) and resumed, deterministic:
    last.pt's model and optimizer bitwise equal (the CUDA RNG state saved and restored)."""
    exact = ["run.deterministic=true", "train.epochs=3"]
    c.python("scripts/train.py", *c.overrides("straight", *exact))
    stop_at = STEPS_PER_EPOCH * 3 // 2
    stopping = c.overrides("resumed", *exact, "run.log_every=1")
    c.python("-c", STOPPING_TRAIN, str(stop_at), *stopping, expect=EXIT_STOPPED)
    c.python("scripts/train.py", *c.overrides("resumed", *exact, "train.resume=auto"))
    straight, resumed = load_last(c.run_dir("straight")), load_last(c.run_dir("resumed"))
    steps = straight["progress"]["step"], resumed["progress"]["step"]
    if steps[0] != steps[1]:
        raise Failed(f"the resumed run ended at step {steps[1]}, the straight one at {steps[0]}")
    count = compare_states(straight, resumed, ("model", "optimizer"))
    return (
        f"{count} entries of model and optimizer bitwise equal at step {steps[0]} (stopped "
        f"at {stop_at}, resumed)"
    )


def check_compile(c: Check) -> str:
    """train.compile=true for 8 steps; evaluate.py and predict.py --device on its best.pt
    (plain keys, inference on this device)."""
    if c.machine.device != "cuda":
        raise Skipped(COMPILE_ON_CPU)
    # Batches of 16, as tests/test_cuda.py compiles: the graphs are then in inductor's cache.
    options = ["train.compile=true", "train.max_steps=8", "train.batch_size=16"]
    c.python("scripts/train.py", *c.overrides("compiled", *options))
    best = str(c.run_dir("compiled") / "best.pt")
    out = c.python("scripts/evaluate.py", "--checkpoint", best, "--json")
    metrics = json.loads(next(line for line in out.splitlines()[::-1] if line.startswith("{")))
    table = c.workdir / "predictions.csv"
    device = ["--device", c.machine.device, "--out", str(table)]
    c.python("scripts/predict.py", "--checkpoint", best, "--split", "val", *device)
    rows = len(table.read_text().splitlines()) - 1
    if rows != 128:  # TINY's validation split
        raise Failed(f"predict.py wrote {rows} rows for the 128 validation samples")
    return f"8 compiled steps; evaluate: val loss {metrics['loss']:.3f}; predict: {rows} rows"


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


def stop_and_resume(
    c: Check, launch: list[str], run: str, args: list[str], total: int, env: dict | None = None
) -> int:
    """Start `launch` + `args`, SIGTERM its process group after run `run`'s first checkpoint,
    check it saved and stopped inside its `total` steps, resume it to the end. Returns the step
    it stopped at. Under torchrun only the ranks' exit code (75) is checked, in their output."""
    proc = c.start(*launch, *args, env=env)
    torchrun = "torch.distributed.run" in launch
    expect = None if torchrun else EXIT_STOPPED
    while not list(c.run_dir(run).glob("step-*.pt")):
        if proc.poll() is not None or time.monotonic() > c.deadline:
            c.wait(proc, expect=expect)  # reports the exit code or the timeout
            raise Failed("no step-*.pt was written before the run ended", tail(proc.log))
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)  # as schedulers do: the whole process group
    output = c.wait(proc, expect=expect)
    stopped = load_last(c.run_dir(run))["progress"]["step"]
    if f"stopped (SIGTERM) at step {stopped}" not in output:
        raise Failed(f"no 'stopped (SIGTERM) at step {stopped}' line", tail(proc.log))
    if not 0 < stopped < total:
        raise Failed(f"last.pt is at step {stopped}, not inside the run's {total} steps")
    c.run(*launch, *args, "train.resume=auto", env=env)
    final = load_last(c.run_dir(run))["progress"]["step"]
    if final != total:
        raise Failed(f"the resumed run ended at step {final}, expected {total}")
    return stopped


# >>> fsdp
def check_fsdp_bf16(c: Check) -> str:
    """train.strategy=fsdp with train.amp=bf16 on the default CNN (BatchNorm kept in fp32),
    its backbone frozen for the first epoch: the unfreeze once failed under FSDP2."""
    if not c.machine.native_bf16:
        raise Skipped("no native bf16 (compute capability < 8.0)")
    fsdp_bf16 = ("train.strategy=fsdp", "train.amp=bf16", "train.freeze_epochs=1")
    args = c.overrides("fsdp_bf16", *fsdp_bf16)
    return last_epoch_line(c.python("scripts/train.py", *args))
# <<< fsdp


def check_channels_last(c: Check) -> str:
    """train.channels_last=true with ddp and with fsdp (weights sharded in the default  # feature: fsdp
    layout, inputs channels_last)."""  # feature: fsdp
    """train.channels_last=true with ddp (weights and inputs channels_last)."""  # feature: !fsdp
    done = []
    for strategy in ("ddp", "fsdp"):  # feature: fsdp
    for strategy in ("ddp",):  # feature: !fsdp
        args = [f"train.strategy={strategy}", "train.channels_last=true"]
        out = c.python("scripts/train.py", *c.overrides(f"channels_last_{strategy}", *args))
        done.append(f"{strategy}: {last_epoch_line(out)}")
    return "; ".join(done)


def check_init_from(c: Check) -> str:
    """train.init_from=<best.pt> with train.resume=auto on a new run (as SLURM jobs pass it)
    starts from those weights: after one step at a negligible lr they are best.pt's, unlike
    a fresh run's."""
    c.python("scripts/train.py", *c.overrides("base"))
    best = c.run_dir("base") / "best.pt"
    one_step = ["train.max_steps=1", "train.resume=auto", "train.lr=1e-9", "train.warmup_steps=0"]
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


# >>> sweeps
def check_sweep_gpus(c: Check) -> str:
    """scripts/sweep.py --parallel 2 without --gpus: the sweep counts the GPUs in a child
    process (never initialising CUDA itself) and runs two trials at a time, on two different
    GPUs with 2+ (both on GPU 0 with one: that says so), each on cuda."""
    if c.machine.device != "cuda":
        raise Skipped("--parallel on the CPU splits CPU threads (the test suite covers it)")
    args = [a for a in c.overrides("unused", "train.epochs=1") if not a.startswith("run.name")]
    grid = ("--name", "sweep", "--parallel", "2", "train.lr=1e-3,2e-3")
    out = c.python("scripts/sweep.py", *grid, *args)
    sweep = c.workdir / "runs" / "sweep"
    trials = json.loads((sweep / "sweep.json").read_text())["trials"]
    states = [t["state"] for t in trials]
    if states != ["done", "done"]:
        raise Failed(f"trial states {states}, expected done, done")
    logs = [(sweep / "logs" / f"{t['id']}.out").read_text(errors="replace") for t in trials]
    if not all(" | cuda" in log for log in logs):
        raise Failed("a trial's run line does not name a cuda device")
    return judge_trial_gpus(trial_gpus(out), [t["id"] for t in trials], c.machine.gpus)


def trial_gpus(output: str) -> dict[str, str]:
    """{trial id: the GPU it started on}, from the sweep's "<id>: started (...) on GPU <id>"
    lines."""
    return dict(re.findall(r"^(\S+): started \(.*\) on GPU (\S+) log ", output, re.M))


def judge_trial_gpus(gpus: dict[str, str], trials: list[str], count: int) -> str:
    """Failed unless every trial started on a GPU and, with 2+ GPUs here, on different ones."""
    missing = [t for t in trials if t not in gpus]
    if missing:
        raise Failed(f"the sweep started {missing[0]} on no GPU (its counting found none?)")
    used = sorted({gpus[t] for t in trials})
    if len(used) < min(count, len(trials)):
        raise Failed(f"{len(trials)} trials at a time all on GPU {used[0]} with {count} GPUs")
    if count < 2:
        return f"{len(trials)} trials at a time, both on GPU {used[0]} (one GPU here)"
    return f"{len(trials)} trials at a time on GPUs {', '.join(used)}: a GPU each"
# <<< sweeps


def check_smoke(c: Check) -> str:
    """scripts/smoke.py: train, checkpoint, resume, evaluate (bf16 where native)."""
    out = c.python("scripts/smoke.py", f"run.device={c.machine.device}")
    return next((line for line in out.splitlines() if line.startswith("smoke test passed")), "")


def check_profile(c: Check) -> str:
    """scripts/train.py --profile 3: the operator table times the GPU's kernels and the CUDA
    memory snapshot is written beside the trace."""
    runs = c.workdir / "profiled"
    sizes = ["data.train_size=512", "data.val_size=64", "train.epochs=1"]
    out = c.python("scripts/train.py", "--profile", "3", *sizes, f"run.output_dir={runs}")
    folder = runs / "default" / "profile"
    table = (folder / "ops.txt").read_text()
    if c.machine.device == "cuda" and not (folder / "memory.pickle").is_file():
        raise Failed("--profile wrote no CUDA memory snapshot", out[-2000:])
    if c.machine.device == "cuda" and "CUDA" not in table:
        raise Failed("--profile's operator table has no CUDA time", table[:2000])
    return next((line for line in out.splitlines() if line.startswith("profile of")), "")


# scripts/train.py with CUDA's caching allocator capped at argv[1] GiB (the rest: its args).
CAPPED_TRAIN = """
import sys
import torch
from {{ cookiecutter.package_name }}.tools.train import train_main
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(min(1.0, float(sys.argv[1]) * 2**30 / total))
raise SystemExit(train_main(sys.argv[2:]))
"""


def check_out_of_memory(c: Check) -> str:
    """train.micro_batch_size=auto with the allocator capped at 2 GiB: batches of 512 images of
    128x128 (about 20 MB of saved activations each in fp32) raise CUDA's out-of-memory error;
    the step backs off to a micro-batch that fits, and the losses stay finite."""
    if c.machine.device != "cuda":
        raise Skipped("CUDA only: the cap is CUDA's allocator's (tests/test_microbatch.py)")
    runs = c.workdir / "capped"
    sizes = ["data.image_size=128", "data.train_size=1024", "data.val_size=256"]
    args = [*sizes, "train.batch_size=512", "train.epochs=1", "train.micro_batch_size=auto"]
    out = c.python("-c", CAPPED_TRAIN, "2", *args, f"run.output_dir={runs}")
    backed_off = re.findall(r"the step runs again at (\d+)", out)
    if not backed_off:
        raise Failed("nothing ran out of memory under a 2 GiB cap: no back-off", out[-2000:])
    with (runs / "default" / "metrics.csv").open() as rows:
        row = list(csv.DictReader(rows))[-1]
    loss = float(row["train/epoch_loss"])
    if not math.isfinite(loss) or int(row["train/micro_batch"]) != int(backed_off[-1]):
        raise Failed(f"after backing off: epoch loss {loss}, row {row}", out[-2000:])
    retries = row.get("memory/alloc_retries")
    return f"512 -> {' -> '.join(backed_off)} under 2 GiB; loss {loss:.4f}; retries {retries}"


def check_combinations(c: Check) -> str:
    """tests/test_combinations.py on this device: every pair of option values trained,
    stopped, resumed and evaluated; fp16 trains here (the CPU refuses it). Minutes:
    not in the default run (--only combinations)."""
    env = {"COMBINATIONS_DEVICE": c.machine.device}
    if c.machine.device == "cuda" and c.machine.gpus < 2:
        env["DIST_BACKEND"] = "gloo"  # its two-rank cases share the GPU
    options = ("-q", "-rs", "-x", "-p", "no:cacheprovider", "-m", "slow")
    out = c.python("-m", "pytest", *options, "tests/test_combinations.py", env=env)
    return pytest_summary(out)
