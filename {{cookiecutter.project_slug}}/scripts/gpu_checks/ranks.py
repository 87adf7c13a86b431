"""Several ranks, through torchrun and the project's own train.py: NCCL on one rank; DDP
(no_sync accumulation, buffer broadcast, SyncBatchNorm, fp16 with its GradScaler) and fsdp on  # feature: fsdp
two ranks, with CPU offload and with compile.  # feature: fsdp
(no_sync accumulation, buffer broadcast, SyncBatchNorm, fp16 with its GradScaler) on two  # feature: !fsdp
ranks, and with compile.  # feature: !fsdp
On one GPU the two ranks share it over gloo
(DIST_BACKEND=gloo: NCCL refuses two ranks on one GPU); with 2+ GPUs they run on NCCL, a GPU
each, as in production."""

from __future__ import annotations

import csv  # feature: fsdp
import json
import shlex  # feature: fsdp

import torch

from {{ cookiecutter.package_name }}.checkpoint import consolidate  # feature: fsdp

from .common import TORCHRUN, Check, Failed, Skipped, distance, last_epoch_line, load_last
from .paths import COMPILE_ON_CPU, long_run, stop_and_resume
from .quick import note_peak

# Runs whose numbers two ranks must reproduce: the same seed, fp32 (no TF32), deterministic
# kernels, no dropout, so that only the order of the reductions differs.
SAME_NUMBERS = ["run.deterministic=true", "train.tf32=false", "model.dropout=0"]
# >>> fsdp
# fsdp against ddp: reduce-scatter and the sharded gradient norm vs all-reduce. Measured on 2
# CPU ranks, 64 steps: 1e-7 apart; with gradients summed instead of averaged (the gloo bug of
# pytorch#162338), 2e-2.
FSDP_TOLERANCE = 1e-4  # relative distance (common.distance) of the final weights
# <<< fsdp
# The quick check's two ranks against one process with their global batch: the MLP, as
# BatchNorm's statistics are each rank's own. Measured on the CPU (2 ranks, 32 steps): step
# 1's loss equal, the weights 1e-7 apart; gradients summed instead of averaged: 1e-2.
QUICK_RANKS = ["model.name=mlp", "run.log_every=1", *SAME_NUMBERS]
STEP1_TOLERANCE = 1e-6  # |diff| of step 1's loss (the mean over ranks): fp32 rounding
RANKS_TOLERANCE = 1e-4  # relative distance of the final weights
STRATEGIES = ("ddp", "fsdp")  # feature: fsdp
STRATEGIES = ("ddp",)  # feature: !fsdp
QUICK_COVERS = ("gloo_on_cuda", *STRATEGIES)  # its CUDA paths (registry.CUDA_PATHS)
# scripts/train.py that writes, on rank 0, each step's loss (the mean over the ranks, as
# loop.read_losses returns it; one step a read with run.log_every=1) to argv[1].
RECORDING_TRAIN = """\
import json, os, sys
from pathlib import Path
from {{ cookiecutter.package_name }} import loop
from {{ cookiecutter.package_name }}.tools.train import train_main
losses, read = [], loop.read_losses
def read_losses(run, *args):
    mean, stop = read(run, *args)
    losses.append(mean)
    return mean, stop
loop.read_losses = read_losses
code = train_main(sys.argv[2:])
if os.environ.get("RANK", "0") == "0":
    Path(sys.argv[1]).write_text(json.dumps(losses))
raise SystemExit(code)
"""


def over(c: Check, ranks: int) -> str:
    """How `ranks` ranks run here, for the detail line."""
    backend = c.machine.backend(ranks)
    shared = c.machine.device == "cuda" and ranks > c.machine.gpus
    return f"{ranks} rank(s) on {backend}" + (" sharing one GPU" if shared else "")


def check_distributed(c: Check) -> str:
    """torchrun with one rank on NCCL (CUDA): the group's set-up bound to its GPU, the object
    collectives of every checkpoint (RNG states) and the teardown; and two NCCL ranks, a GPU
    each, with 2+ GPUs. On the CPU: one rank on gloo."""
    counts = [1, 2] if c.machine.gpus >= 2 else [1]
    done = []
    for ranks in counts:
        launch = [*TORCHRUN, f"--nproc_per_node={ranks}", "scripts/train.py"]
        out = c.run(*launch, *c.overrides(f"dist{ranks}"))
        world = load_last(c.run_dir(f"dist{ranks}"))["meta"]["world_size"]
        if world != ranks:
            raise Failed(f"last.pt says world size {world}, expected {ranks}")
        if f"x {ranks} |" not in out:
            raise Failed(f"the run line does not say {c.machine.device} x {ranks}", out[-2000:])
        done.append(f"{over(c, ranks)}: world size {world} in last.pt")
    return "; ".join(done)


def check_ddp(c: Check) -> str:
    """DistributedDataParallel on two ranks with train.sync_bn (SyncBatchNorm), train.amp=fp16
    (its GradScaler) and 2 micro-batches a step (no_sync on the first); BatchNorm buffers
    broadcast from rank 0; stopped by SIGTERM after its first checkpoint and resumed to the
    end. On the CPU without SyncBatchNorm and fp16, which need CUDA."""
    launch, env = c.launch(2)
    cuda = c.machine.device == "cuda"
    options = ["train.grad_accum_steps=2", *(["train.sync_bn=true", "train.amp=fp16"] * cuda)]
    long, micro_steps = long_run(c, ranks=2)
    total = micro_steps // 2  # 2 micro-batches a step
    args = c.overrides("ddp", *options, *long)
    stopped = stop_and_resume(c, launch, "ddp", args, total, env)
    state = load_last(c.run_dir("ddp"))
    if state["meta"]["world_size"] != 2:
        raise Failed(f"last.pt says world size {state['meta']['world_size']}, expected 2")
    if cuda and not state["scaler"]:
        raise Failed("train.amp=fp16 under DDP saved no GradScaler state")
    scale = f", fp16 loss scale {state['scaler']['scale']:g}" if cuda else ""
    used = "sync_bn, fp16, " if cuda else ""
    return (
        f"{over(c, 2)}: {used}accumulation 2{scale}; SIGTERM at step {stopped}, resumed to "
        f"step {total}"
    )


# >>> fsdp
def check_fsdp(c: Check) -> str:
    """train.strategy=fsdp on one process (a one-rank group) and on two ranks: each stopped by
    SIGTERM after its first checkpoint, then resumed to the end; the two-rank run's final
    weights against a two-rank ddp run's from the same seed (fsdp_agrees_with_ddp). Reports
    each run's peak CUDA memory in its first epoch and its start-up peaks. On the CPU two
    ranks only (the test suite runs fsdp on one process there)."""
    done = []
    for ranks in (1, 2) if c.machine.device == "cuda" else (2,):  # one GPU: the two share it
        launch, env = c.launch(ranks)
        run, (long, total) = f"fsdp{ranks}", long_run(c, ranks)
        args = c.overrides(run, "train.strategy=fsdp", *long, *SAME_NUMBERS)
        stopped = stop_and_resume(c, launch, run, args, total, env)
        world = load_last(c.run_dir(run))["meta"]["world_size"]
        if world != ranks:
            raise Failed(f"{run}: last.pt says world size {world}, expected {ranks}")
        peak = first_epoch_memory(c, run)
        if peak is not None:
            c.figures[f"fsdp{ranks}_peak_mb_epoch1_rank0"] = peak
        c.figures[f"fsdp{ranks}_start_up"] = start_up_memory(c, run)
        done.append(f"{over(c, ranks)} stopped at step {stopped}, resumed to {total}")
    done.append(fsdp_agrees_with_ddp(c, [*long, *SAME_NUMBERS]))
    return "; ".join(done)


def fsdp_agrees_with_ddp(c: Check, options: list[str]) -> str:
    """Run fsdp2's training again under ddp on two ranks, straight through; their final
    weights must agree to FSDP_TOLERANCE: fsdp's reduce-scatter (over gloo where the ranks
    share a GPU), its sharded gradient norm and its resume computed what ddp's all-reduce
    does. A run that only finishes would not show gradients summed instead of averaged."""
    launch, env = c.launch(2)
    c.run(*launch, *c.overrides("ddp2", "train.strategy=ddp", *options), env=env)
    full = consolidate(c.run_dir("fsdp2") / "last.pt")  # its shards as one model
    fsdp = torch.load(full, map_location="cpu", weights_only=True)["model"]
    apart = distance(fsdp, load_last(c.run_dir("ddp2"))["model"])
    name = "fsdp vs ddp weights, 2 ranks (relative distance)"
    c.target(name, apart, FSDP_TOLERANCE, at_most=True, judged=True)
    if not apart <= FSDP_TOLERANCE:
        raise Failed(
            f"the 2-rank fsdp run's final weights are {apart:.2e} from ddp's (same seed, "
            f"deterministic; at most {FSDP_TOLERANCE:g}): its gradient reduction differs"
        )
    return f"weights {apart:.1e} from 2-rank ddp's"


def start_up_memory(c: Check, run: str) -> str:
    """What building and sharding the model raised each rank's peaks by, as run `run`'s
    start-up line says (parallel.start_up_report), read from the log of its first start:
    no rank holds the whole model on the GPU."""
    for proc in c.started:
        if f"run.name={run}" in shlex.split(proc.command):
            for line in proc.log.read_text(errors="replace").splitlines():
                if line.startswith("start-up peak memory per rank"):
                    return line.split(": ", 1)[1]
            break
    raise Failed(f"{run} printed no start-up peak memory per rank (fsdp.shard)")


def first_epoch_memory(c: Check, run: str) -> float | None:
    """Rank 0's peak CUDA memory in the run's first epoch (metrics.csv), None on the CPU."""
    with (c.run_dir(run) / "metrics.csv").open() as rows:
        first = next(csv.DictReader(rows), {})
    value = first.get("memory/cuda_peak_mb")
    return float(value) if value else None


def check_cpu_offload(c: Check) -> str:
    """train.strategy=fsdp with train.cpu_offload=true (shards and optimizer step in CPU
    memory, gradient norm all-reduced on the CPU), on one process and on two ranks."""
    if c.machine.device != "cuda":
        raise Skipped("train.cpu_offload needs CUDA GPUs (refused on the CPU)")
    done = []
    for ranks in (1, 2):  # on one GPU the two ranks share it
        launch, env = c.launch(ranks)
        args = c.overrides(f"offload{ranks}", "train.strategy=fsdp", "train.cpu_offload=true")
        done.append(f"{over(c, ranks)}: {last_epoch_line(c.run(*launch, *args, env=env))}")
    return "; ".join(done)
# <<< fsdp


def check_compile_ddp(c: Check) -> str:
    """train.compile=true in DistributedDataParallel on two ranks, 8 steps."""
    if c.machine.device != "cuda":
        raise Skipped(COMPILE_ON_CPU)
    launch, env = c.launch(2)
    args = c.overrides("compile_ddp", "train.compile=true", "train.max_steps=8")
    return f"{over(c, 2)}: {last_epoch_line(c.run(*launch, *args, env=env))}"


# >>> fsdp
def check_compile_fsdp(c: Check) -> str:
    """train.compile=true with train.strategy=fsdp, one process and two ranks, 8 steps."""
    if c.machine.device != "cuda":
        raise Skipped(COMPILE_ON_CPU)
    done = []
    for ranks in (1, 2):  # on one GPU the two ranks share it
        launch, env = c.launch(ranks)
        options = ["train.strategy=fsdp", "train.compile=true", "train.max_steps=8"]
        out = c.run(*launch, *c.overrides(f"compile_fsdp{ranks}", *options), env=env)
        done.append(f"{over(c, ranks)}: {last_epoch_line(out)}")
    return "; ".join(done)
# <<< fsdp


def check_syncbn(c: Check) -> str:
    """SyncBatchNorm on two ranks, each with half a batch, against BatchNorm on the whole
    batch: outputs, running statistics, input and weight gradients (numerics.py's ranks)."""
    if c.machine.device != "cuda":
        raise Skipped("SyncBatchNorm runs on GPUs only")
    launch, env = c.launch(2)
    result = c.workdir / "syncbn.json"
    ranks = [*launch[:-1], "-m", "gpu_checks.numerics", "syncbn", str(result)]
    c.run(*ranks, env=env)
    from .numerics import judge_syncbn

    return judge_syncbn(c, result)


def check_quick_ranks(c: Check) -> str:
    """Two ranks sharing the GPU over gloo (with 2+ GPUs: NCCL, one each), 16 samples each,
    against one process with the whole batch of 32 (the MLP, fp32, deterministic, 32 steps):
    step 1's loss within 1e-6, the final weights within 1e-4 (relative distance), under ddp  # feature: fsdp
    and under fsdp."""  # feature: fsdp
    step 1's loss within 1e-6, the final weights within 1e-4 (relative distance), under ddp."""  # feature: !fsdp
    script = c.workdir / "record_losses.py"
    script.write_text(RECORDING_TRAIN)
    one = ranked_run(c, script, "one", 1, "train.batch_size=32")
    done = []
    for strategy in STRATEGIES:
        options = ("train.batch_size=16", f"train.strategy={strategy}")
        done.append(compare_ranks(c, strategy, one, ranked_run(c, script, strategy, 2, *options)))
    note_peak(c)
    return f"{over(c, 2)} against one process: {'; '.join(done)}"


def ranked_run(c: Check, script, run: str, ranks: int, *more: str) -> dict:
    """`script` (RECORDING_TRAIN) on `ranks` ranks as run `run`: its losses, final weights."""
    launch, env = c.launch(ranks)
    losses = c.workdir / f"{run}.json"
    args = c.overrides(run, *QUICK_RANKS, *more)
    c.run(*launch[:-1], str(script), str(losses), *args, env=env)  # launch[-1]: train.py
    last = c.run_dir(run) / "last.pt"
    last = consolidate(last) if run == "fsdp" else last  # its shards as one model  # feature: fsdp
    model = torch.load(last, map_location="cpu", weights_only=True)["model"]
    return {"losses": json.loads(losses.read_text()), "model": model}


def compare_ranks(c: Check, name: str, one: dict, ranks: dict) -> str:
    """Run `ranks` (two ranks) against `one` (one process, the same global batch): step 1's
    loss and the final weights, each a target; Failed if either is out of its tolerance."""
    if len(ranks["losses"]) != len(one["losses"]) or not one["losses"]:
        raise Failed(f"{name}: {len(ranks['losses'])} steps on 2 ranks, {len(one['losses'])} on 1")
    step1 = abs(ranks["losses"][0] - one["losses"][0])
    apart = distance(ranks["model"], one["model"])
    steps = len(one["losses"])
    c.target(f"{name}, 2 ranks vs 1: step-1 loss |diff|", step1, STEP1_TOLERANCE, True, True)
    c.target(f"{name}, 2 ranks vs 1: final weights", apart, RANKS_TOLERANCE, True, True)
    if not step1 <= STEP1_TOLERANCE:
        raise Failed(
            f"{name}: step 1's loss is {ranks['losses'][0]:.7f} on 2 ranks, "
            f"{one['losses'][0]:.7f} on one process with their batch (at most {STEP1_TOLERANCE:g})"
        )
    if not apart <= RANKS_TOLERANCE:
        raise Failed(
            f"{name}: after {steps} steps the 2 ranks' weights are {apart:.1e} from one "
            f"process's (relative; at most {RANKS_TOLERANCE:g}): their gradients differ"
        )
    return f"{name} step-1 loss {step1:.0e} apart, weights {apart:.0e} after {steps} steps"
