"""Device choice, CPU threads, mixed precision, backend switches and the one place that moves
batches to the device."""

from __future__ import annotations

import contextlib
import os
import resource
import sys

import torch

from ..errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` prefers CUDA (this rank's GPU), then Apple MPS, then CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        raise ConfigError(
            f"run.device={name} but CUDA is not available (torch {torch.__version__}, {build} "
            "build); run `python scripts/doctor.py` to see why, or use run.device=cpu"
        )
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("run.device=mps but MPS is not available; use run.device=cpu")
    if name == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(name)


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 runs natively (fast) on `device`. `torch.cuda.is_bf16_supported()` also
    counts emulation: V100 and T4 (compute capability 7.x) report bf16 but run it slowly."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "mps":  # bf16 on Apple GPUs needs macOS 14
        newer = getattr(torch.backends.mps, "is_macos_or_newer", None)
        return bool(newer and newer(14, 0))
    return True  # CPU autocast computes bf16 on any x86/Arm CPU (fast with AVX512-BF16/AMX)


def default_amp(device: torch.device) -> str:
    """The fastest safe mode: bf16 where native, fp16 (with a GradScaler) on older GPUs."""
    if device.type == "cuda":
        return "bf16" if native_bf16(device) else "fp16"
    return "off"


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse a mixed-precision mode the device cannot run well, before anything is written."""
    if amp == "fp16" and device.type == "cpu":
        raise ConfigError("train.amp=fp16 needs a GPU; use train.amp=bf16 on CPU (or off)")
    if amp == "bf16" and not native_bf16(device):
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            where = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
        else:
            where = "MPS before macOS 14"
        raise ConfigError(
            f"train.amp=bf16 is emulated (slow) on {where}; use train.amp=fp16, which "
            "adds loss scaling, or train.amp=off"
        )


def torch_older_than(major: int, minor: int) -> bool:
    """Whether the torch running is older than major.minor (what needs a newer one than the
    floor, 2.6, is refused below its version)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return version < (major, minor)


def autocast(device: torch.device, amp: str):
    """The mixed-precision context for train.amp (off / bf16 / fp16) on this device."""
    if amp == "off":
        # Not even a disabled torch.autocast: torch < 2.5 refuses to build one for "mps".
        return contextlib.nullcontext()
    return torch.autocast(device.type, AMP_DTYPES[amp])


def configure_backends(device: torch.device, tf32: bool, deterministic: bool) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)  # one process on cuda:N (torchrun ranks: distributed.py)
        set_tf32(tf32)
        # benchmark picks the fastest conv algorithm per shape, which is not deterministic.
        torch.backends.cudnn.benchmark = not deterministic


_legacy_cudnn_tf32 = True  # torch's default for torch.backends.cudnn.allow_tf32


def set_tf32(enabled: bool) -> None:
    """TF32 (fp32's range with a 10-bit mantissa: ~free speed on Ampere+ for training) for
    CUDA matmuls and cuDNN convolutions, or full fp32 (IEEE).

    torch >= 2.9 has per-operation `fp32_precision` flags; the `allow_tf32` flags are the
    legacy API. Both are set here, because torch 2.9-2.13 raise a RuntimeError ("mix of the
    legacy and new APIs") when anything reads the legacy state (torch.get_float32_matmul_
    precision(), inductor's autotuning, other libraries) after only the new flags changed.
    The legacy matmul setter warns in no version; the legacy cuDNN setter warns once on torch
    2.9, so it is called only to change its value (on by default)."""
    global _legacy_cudnn_tf32
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if not hasattr(matmul, "fp32_precision") or not hasattr(cudnn, "conv"):  # torch < 2.9
        matmul.allow_tf32 = cudnn.allow_tf32 = enabled
        return
    precision = "tf32" if enabled else "ieee"
    matmul.fp32_precision = precision
    matmul.allow_tf32 = enabled  # the legacy state, in step with the flag above
    if _legacy_cudnn_tf32 != enabled:
        cudnn.allow_tf32 = _legacy_cudnn_tf32 = enabled
    cudnn.conv.fp32_precision = cudnn.rnn.fp32_precision = precision


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, cgroups, SLURM) where the
    OS reports one, else every CPU of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def configure_threads(requested: int, local_world_size: int | None = None) -> int:
    """Set torch's intra-op CPU threads for run.threads and return the count in use.

    0 (auto) shares this process's CPUs among the processes of this machine (torchrun's
    LOCAL_WORLD_SIZE): torch's default of one thread per core in every process oversubscribes
    the CPUs, which made training several times slower. An OMP_NUM_THREADS set by the user
    (or by torchrun) already chose, so auto keeps torch's count then (torch caps it itself).
    A count above the usable CPUs is refused: such threads only wait for a CPU, and very many
    (100,000) crashed the process at its first operation, with no message."""
    cpus = usable_cpus()
    if requested > cpus:
        raise ConfigError(
            f"run.threads={requested} is more than the {cpus} CPUs this process may use (its "
            f"affinity mask); use run.threads={cpus} or fewer, or 0 (auto)"
        )
    if requested == 0 and os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    if requested == 0:
        processes = local_world_size or local_processes()
        requested = max(1, cpus // processes)
    if torch.get_num_threads() != requested:
        torch.set_num_threads(requested)
    return requested


def local_processes() -> int:
    """The processes of this run on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError:
        return 1


# Loader worker processes per usable CPU beyond which data.num_workers is refused. Workers
# that wait on storage can use more than one per CPU; far more only compete for the CPUs and
# each holds its own memory (2 loaders x 256 workers could fill a small machine's memory).
WORKERS_PER_CPU = 4


def check_workers(num_workers: int) -> None:
    """Refuse a data.num_workers that this machine cannot run (before any worker starts)."""
    cpus, processes = usable_cpus(), local_processes()
    limit = max(1, WORKERS_PER_CPU * cpus // processes)
    if num_workers > limit:
        where = f"{cpus} CPUs" + (f" shared by {processes} processes" if processes > 1 else "")
        raise ConfigError(
            f"data.num_workers={num_workers} is more than {WORKERS_PER_CPU} loader processes "
            f"per CPU this process may use ({where}); use data.num_workers={limit} or fewer "
            "(scripts/benchmark_dataloader.py measures which count is fastest)"
        )


def check_batch_memory(sample_bytes, batch_size: int, workers: int) -> None:
    """Refuse, before any is decoded, batches whose inputs alone would take over half the
    memory free (the model needs the rest): a large data.image_size otherwise runs until the
    kernel's OOM killer ends it, having taken the whole machine, without a word.
    `sample_bytes()`: a dataset's memory per decoded sample (None: not known)."""
    free = free_memory()
    if sample_bytes is None or free is None:
        return
    batch = sample_bytes() * batch_size
    held = batch * (1 + 2 * workers)  # each worker prefetches 2 batches (torch's default)
    if held > free / 2:
        gb = 2**30
        raise ConfigError(
            f"a batch of {batch_size} inputs takes {batch / gb:.1f} GB decoded "
            f"({held / gb:.1f} GB with the {workers} loader workers' prefetch), over half the "
            f"{free / gb:.1f} GB of memory free; lower data.image_size, train.batch_size or "
            "data.num_workers"
        )


def free_memory() -> int | None:
    """Bytes of memory free for new allocations (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            line = next(line for line in f if line.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def busy_note(threads: int) -> str:
    """A note for the run line when the machine is busy (1-minute load above its CPUs) and this
    process uses several threads: then one thread each was several times faster."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cpus = os.cpu_count() or 1
    if threads <= 1 or load <= cpus:
        return ""
    return f" (machine busy: load {load:.1f} on {cpus} CPUs; run.threads=1 is faster then)"


def to_device(batch, device: torch.device):
    """Move a tensor or a (nested) tuple/list/dict of tensors; async from pinned memory on CUDA."""
    if isinstance(batch, torch.Tensor):
        if batch.device == device:  # already there (CPU training): .to() would return it too
            return batch
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def sums_dtype(device: torch.device) -> torch.dtype:
    """The dtype of metric sums that add up over batches and ranks: float64, but float32 on
    Apple's MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def peak_memory(device: torch.device) -> dict[str, float]:
    """This process's peaks so far, in MB: resident host memory and, on CUDA, GPU memory
    allocated (without resetting the GPU's peak, which memory_mb reports per epoch)."""
    peaks = {"host": memory_mb(torch.device("cpu"))[1]}
    if device.type == "cuda":
        peaks["cuda"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peaks


def memory_mb(device: torch.device) -> tuple[str, float]:
    """(metric name, MB): on CUDA the peak allocation since the last call (so each epoch has
    its own), on MPS the driver's current allocation (MPS keeps no peak), on CPU the process's
    peak resident memory."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
        return "memory/cuda_peak_mb", peak
    if device.type == "mps":
        return "memory/mps_driver_mb", torch.mps.driver_allocated_memory() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB elsewhere
    return "memory/rss_peak_mb", rss / 2**20 if sys.platform == "darwin" else rss / 2**10
