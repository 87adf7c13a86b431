"""The checks in the order they run, the package's CUDA paths each one covers, and what only
a machine with several GPUs proves.

tests/test_gpu_check.py keeps CUDA_PATHS true: every function of the package that branches on
CUDA (names cuda, cudnn, nccl, pinned memory, a GradScaler, SyncBatchNorm, CPU offload) is a
site of some path, and every path is covered by a check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import numerics, paths, pretrained, quick, ranks, speed  # feature: pretrained
from . import numerics, paths, quick, ranks, speed  # feature: !pretrained
from .common import Check


@dataclass(frozen=True)
class Spec:
    name: str
    run: Callable[[Check], str]  # its docstring says what it runs (--list)
    covers: tuple[str, ...]  # keys of CUDA_PATHS
    limit: float  # seconds on a GPU before it is stopped (--timeout replaces it)
    worker: bool = False  # runs in a child interpreter (scripts/gpu_check.py --worker)
    default: bool = True  # in the run without --only


# Each path: (what it is, the package functions that hold it: "file.py:function").
CUDA_PATHS = {
    "device": (
        "run.device=cuda|cuda:N|auto picks a GPU; under torchrun rank r takes GPU LOCAL_RANK",
        ("utils/device.py:resolve_device", "config/validate.py:validate")
        + ("config/validate.py:_is_cuda_index", "distributed.py:setup"),
    ),
    "tf32": (
        "TF32 through torch's fp32_precision flags (train.tf32), cudnn.benchmark",
        ("utils/device.py:<module>", "utils/device.py:configure_backends")
        + ("utils/device.py:set_tf32",),
    ),
    "bf16": (
        "native bf16 from compute capability 8.0; the default mixed precision on a GPU",
        ("utils/device.py:native_bf16", "utils/device.py:default_amp")
        + ("utils/device.py:check_amp", "tools/train.py:_smoke"),
    ),
    "fp16": ("fp16 autocast with its GradScaler", ("trainer.py:build_trainee", "loop.py:Trainee")),
    "pinned": (
        "page-locked batches and non_blocking copies to the GPU",
        ("config/schema.py:DataConfig", "data/__init__.py:build_loader")
        + ("trainer.py:build_loaders", "utils/device.py:to_device"),
    ),
    "memory": (
        "CUDA peak memory per epoch and at fsdp's start-up",  # feature: fsdp
        "CUDA peak memory per epoch",  # feature: !fsdp
        ("utils/device.py:memory_mb", "utils/device.py:peak_memory"),
    ),
    "record": (
        "run.json's GPUs, driver, CUDA, cuDNN and NCCL; reproduce.py and compare_runs.py on them",
        ("utils/provenance.py:software", "utils/provenance.py:machine")
        + ("utils/provenance.py:differences", "tools/reproduce.py:flat"),
    ),
    "profile": (
        "train.py --profile: the GPU's kernels in the trace, the CUDA memory snapshot",
        ("tools/profiling.py:StepProfiler",),
    ),
    "micro_batch": (
        "train.micro_batch_size=auto: CUDA's out-of-memory error caught, the step retried at half",
        ("microbatch.py:is_oom", "microbatch.py:_back_off", "microbatch.py:memory_columns"),
    ),
    "rng": (
        "CUDA RNG states saved and restored",
        ("utils/seed.py:rng_state", "utils/seed.py:set_rng_state"),
    ),
    "deterministic": ("cuBLAS workspace, cuDNN deterministic", ("utils/seed.py:seed_everything",)),
    "nccl": (
        "the NCCL group bound to its GPU, object collectives, teardown",
        ("distributed.py:join",),
    ),
    "gloo_on_cuda": (
        "DIST_BACKEND=gloo: ranks sharing a GPU",
        ("distributed.py:gloo_on_cuda", "distributed.py:join"),
    ),
    "ddp": ("DistributedDataParallel on GPUs (device_ids), no_sync", ("parallel.py:wrap",)),
    "sync_bn": ("SyncBatchNorm (GPUs only)", ("parallel.py:replica",)),
    # >>> fsdp
    "fsdp": (
        "fsdp on GPUs: built on meta, shards from rank 0's host copy, mixed precision, offload",
        ("fsdp.py:shard", "fsdp.py:check_device"),
    ),
    # <<< fsdp
    "compile": ("torch.compile on a GPU (inductor, triton)", ("parallel.py:wrap",)),
    "inference": (
        "evaluate.py and predict.py --device cuda on a CUDA checkpoint",
        (
            "tools/inference.py:device_option",
            "tools/predict.py:predict_main",
            "tools/predict.py:_parser",
        ),
    ),
    # >>> sweeps
    "sweep_gpus": (
        "sweep trials on GPUs of their own, counted in a child process, forked from a sweep "
        "that never initialised CUDA (a trial forked after it refuses to start)",
        ("tools/sweep_plan.py:slots_for", "tools/sweep_launch.py:can_fork")
        + ("tools/sweep_launch.py:<module>", "tools/sweep_launch.py:inherited_cuda"),
    ),
    # <<< sweeps
}

# What one GPU cannot prove: the check runs it when it finds several GPUs.
SEVERAL_GPUS = [
    "NCCL collectives between GPUs: DDP's all-reduce, fsdp's all-gather and reduce-scatter, "  # feature: fsdp
    "NCCL collectives between GPUs: DDP's all-reduce, "  # feature: !fsdp
    "SyncBatchNorm's all-gather (on one GPU the ranks share it over gloo)",
    "rank r on GPU LOCAL_RANK under torchrun (on one GPU every rank is on cuda:0)",
    "sweep trials on different GPUs (sweep_plan's CUDA_VISIBLE_DEVICES)",  # feature: sweeps
]

# The order they run in: what proves most first, so that a run cut short by --budget has it.
# Limits are 3-4 times (LIMIT_OVER_EXPECTED) the seconds each is expected to take on one H200
# (a cold start): expected_seconds() sums those for docs/gpu-check.md's estimate of a run.
LIMIT_OVER_EXPECTED = (3, 4)
CHECKS = (
    Spec(
        "default_run",
        paths.check_default_run,
        ("device", "tf32", "pinned", "memory", "record"),
        60,
    ),
    Spec("numerics", numerics.check_numerics, ("tf32", "bf16", "fp16", "deterministic"), 90, True),
    Spec("speed_cnn", speed.check_speed_cnn, ("pinned",), 120, True),
    Spec("speed_lm", speed.check_speed_lm, ("bf16", "tf32", "compile"), 240, True),
    Spec("ddp", ranks.check_ddp, ("ddp", "sync_bn", "fp16", "gloo_on_cuda"), 120),
    Spec("syncbn", ranks.check_syncbn, ("sync_bn", "gloo_on_cuda"), 60),
    Spec("distributed", ranks.check_distributed, ("nccl", "device"), 60),
    Spec("fsdp", ranks.check_fsdp, ("fsdp", "gloo_on_cuda", "memory"), 180),  # feature: fsdp
    Spec("cpu_offload", ranks.check_cpu_offload, ("fsdp", "nccl"), 90),  # feature: fsdp
    Spec("resume", paths.check_resume, ("rng", "deterministic", "device"), 90),
    Spec("preemption", paths.check_preemption, ("pinned",), 90),
    Spec("tests", paths.check_tests, ("fp16", "bf16", "pinned", "compile"), 180),
    Spec("compile", paths.check_compile, ("compile", "inference"), 150),
    Spec("compile_ddp", ranks.check_compile_ddp, ("compile", "ddp"), 150),
    Spec("compile_fsdp", ranks.check_compile_fsdp, ("compile", "fsdp"), 200),  # feature: fsdp
    Spec("fsdp_bf16", paths.check_fsdp_bf16, ("fsdp", "bf16"), 60),  # feature: fsdp
    Spec("channels_last", paths.check_channels_last, ("fsdp",), 60),  # feature: fsdp
    Spec("channels_last", paths.check_channels_last, ("ddp",), 60),  # feature: !fsdp
    Spec("init_from", paths.check_init_from, ("device",), 90),
    Spec("sweep_gpus", paths.check_sweep_gpus, ("sweep_gpus",), 90),  # feature: sweeps
    Spec("smoke", paths.check_smoke, ("bf16",), 60),
    Spec("profile", paths.check_profile, ("profile", "memory"), 60),
    Spec("out_of_memory", paths.check_out_of_memory, ("micro_batch", "memory"), 90),
    # >>> pretrained
    Spec("pretrained", pretrained.check_pretrained, ("bf16", "compile", "fsdp"), 240),  # feature: fsdp
    Spec("pretrained", pretrained.check_pretrained, ("bf16", "compile", "ddp"), 240),  # feature: !fsdp
    # <<< pretrained
    Spec("combinations", paths.check_combinations, ("fp16",), 3600, default=False),
)


# The quick check (--quick): six checks for one short GPU window, at most 240 s on one H200
# with the script's own start (quick.py says what each proves). Not in the default run, whose
# checks prove the same and more at larger sizes.
QUICK = (
    Spec("quick_trace", quick.check_quick_trace, ("device", "deterministic"), 60, True, False),
    Spec("quick_twice", quick.check_quick_twice, ("deterministic", "rng"), 60, True, False),
    Spec("quick_resume", quick.check_quick_resume, ("rng", "deterministic"), 90, False, False),
    Spec("quick_amp", quick.check_quick_amp, ("bf16", "fp16"), 60, True, False),
    Spec("quick_ranks", ranks.check_quick_ranks, ranks.QUICK_COVERS, 120, False, False),
    Spec("quick_speed", speed.check_quick_speed, ("pinned", "bf16", "memory"), 120, True, False),
)
# The default run in groups (--group N or NAME), each for one call of at most 9 minutes
# (--list prints their estimates), in the order worth running them: numbers first, then
# several ranks, then compile and what builds on it.
GROUPS = {
    "numbers": ["default_run", "numerics", "speed_cnn", "speed_lm", "resume", "smoke", "profile"],
    "ranks": ["ddp", "syncbn", "distributed", "preemption", "channels_last", "init_from"],
    "compile": ["tests", "compile", "compile_ddp"],
}
GROUPS["ranks"] += ["fsdp", "cpu_offload", "fsdp_bf16"]  # feature: fsdp
GROUPS["ranks"] += ["out_of_memory"]  # one process, its allocator capped: after the others
GROUPS["compile"] += ["compile_fsdp"]  # feature: fsdp
GROUPS["compile"] += ["sweep_gpus"]  # feature: sweeps
GROUPS["compile"] += ["pretrained"]  # feature: pretrained
START_SECONDS = 10  # scripts/gpu_check.py's own start: Python, torch, CUDA


def group(chosen: str) -> list[str] | None:
    """The checks of group `chosen` (its number from 1, or its name) in the order they run;
    None if there is no such group."""
    names = list(GROUPS)
    if chosen.isdigit() and 1 <= int(chosen) <= len(names):
        chosen = names[int(chosen) - 1]
    members = GROUPS.get(chosen)
    return None if members is None else [s.name for s in CHECKS if s.name in members]


def sets() -> dict[str, list[Spec]]:
    """What --list shows: the quick set, each group (by number and name), last the checks in
    no group (--only NAME)."""
    specs = {spec.name: spec for spec in CHECKS}
    found = {"quick (--quick; make gpu-check-quick)": list(QUICK)}
    for i, name in enumerate(GROUPS, 1):
        found[f"group {i}, {name} (--group {i})"] = [specs[n] for n in group(name)]
    grouped = {n for members in GROUPS.values() for n in members}
    found["in no group (--only NAME)"] = [s for s in CHECKS if s.name not in grouped]
    return found


def estimate(specs) -> tuple[float, float]:
    """Seconds `specs` are expected to take on one H200, (least, most): each check's limit
    over LIMIT_OVER_EXPECTED, summed, and the script's start. An estimate until a GPU has run
    them (the report's seconds)."""
    total = sum(spec.limit for spec in specs)
    fewest, most = LIMIT_OVER_EXPECTED
    return START_SECONDS + total / most, START_SECONDS + total / fewest


def expected_seconds(checks=CHECKS) -> tuple[float, float]:
    """The default run's expected seconds on one H200, (least, most): each check's limit over
    LIMIT_OVER_EXPECTED, summed. An estimate until measured on a GPU (the report's seconds)."""
    total = sum(spec.limit for spec in checks if spec.default)
    fewest, most = LIMIT_OVER_EXPECTED
    return total / most, total / fewest
