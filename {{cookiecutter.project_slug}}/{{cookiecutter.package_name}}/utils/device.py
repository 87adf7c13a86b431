"""Device choice, backend switches and the one place that moves batches to the device."""

from __future__ import annotations

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


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse a mixed-precision mode the device cannot run, before anything is written."""
    if amp == "fp16" and device.type == "cpu":
        raise ConfigError("train.amp=fp16 needs a GPU; use train.amp=bf16 on CPU (or off)")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"train.amp=bf16 is not supported on {name}; use train.amp=fp16")


def autocast(device: torch.device, amp: str):
    """The mixed-precision context for train.amp (off / bf16 / fp16) on this device."""
    return torch.autocast(device.type, AMP_DTYPES.get(amp), enabled=amp != "off")


def configure_backends(device: torch.device, tf32: bool, deterministic: bool) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # TF32 keeps fp32 range with a 10-bit mantissa: ~free speed on Ampere+ for training.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        # benchmark picks the fastest conv algorithm per shape, which is not deterministic.
        torch.backends.cudnn.benchmark = not deterministic


def to_device(batch, device: torch.device):
    """Move a tensor or a (nested) tuple/list/dict of tensors; async from pinned memory on CUDA."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory since the last reset, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB else
