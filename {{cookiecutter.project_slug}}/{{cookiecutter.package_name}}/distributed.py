"""Process-group setup for torchrun, and the few collectives the trainer needs.

Launched with plain `python`, everything here is a no-op on a single process, so the training
code never branches on whether it is distributed.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .errors import ConfigError
from .utils.device import resolve_device
from .utils.signals import StopSignal

# Before any init_process_group: see teardown(). Cheap (~20 ms), and every run's optimizer
# imports it anyway (through torch._dynamo), so it stays here rather than in join().
if dist.is_available():
    import torch.distributed.nn  # noqa: F401


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# The device types the process group serves, recorded when distributed.py makes it: every
# collective below checks its tensor against them (see _check_device).
_serves: tuple[str, ...] = ()


def setup(device_name: str, cpu_collectives: bool = False) -> tuple[DistInfo, torch.device]:
    """Join the process group when torchrun (or srun + torchrun) set RANK/WORLD_SIZE.
    `cpu_collectives`: on GPUs, also serve CPU tensors (see join())."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo(), resolve_device(device_name)
    info = DistInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    if device_name.startswith("cuda:") and info.world_size > 1:
        raise ConfigError(
            f"run.device={device_name} would put all {info.world_size} ranks on one GPU; use "
            "run.device=cuda (rank r takes GPU LOCAL_RANK) and choose GPUs with "
            "CUDA_VISIBLE_DEVICES"
        )
    device = resolve_device(device_name, info.local_rank)
    join(device, cpu_collectives)
    return info, device


def join(device: torch.device, cpu_collectives: bool = False, **alone) -> None:
    """Make the process group for `device`: NCCL on CUDA (for CUDA tensors only), gloo on
    the CPU. `cpu_collectives` adds gloo for CPU tensors beside NCCL (gradients kept in CPU
    memory on GPU ranks: their norm is all-reduced there). `alone`: store, rank and
    world_size of a group without torchrun."""
    global _serves
    if device.type == "cuda" and gloo_on_cuda():
        torch.cuda.set_device(device)
        dist.init_process_group("gloo", **alone)  # gloo serves CPU and CUDA tensors
        _serves = ("cuda", "cpu")
    elif device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl" if cpu_collectives else "nccl"
        dist.init_process_group(backend, device_id=device, **alone)  # binds the rank to its GPU
        _serves = ("cuda", "cpu") if cpu_collectives else ("cuda",)
    else:
        dist.init_process_group("gloo", **alone)
        _serves = ("cpu",)


# DIST_BACKEND=gloo: CUDA ranks talk over gloo instead of NCCL. NCCL refuses two ranks on one
# GPU; gloo lets several share it (slowly, through host memory): DDP, SyncBatchNorm and fsdp  # feature: fsdp
# GPU; gloo lets several share it (slowly, through host memory): DDP and SyncBatchNorm  # feature: !fsdp
# then run on two ranks of a one-GPU machine.
BACKEND_VARIABLE = "DIST_BACKEND"


def gloo_on_cuda() -> bool:
    value = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if value not in ("", "nccl", "gloo"):
        raise ConfigError(
            f"{BACKEND_VARIABLE}={value!r} is not a backend this project uses; set it to gloo "
            "(CUDA ranks over gloo, e.g. several ranks on one GPU) or nccl, or unset it"
        )
    return value == "gloo"


def join_alone(device: torch.device, cpu_collectives: bool = False) -> None:
    """A one-rank group for one process without torchrun."""
    join(device, cpu_collectives, store=dist.HashStore(), rank=0, world_size=1)


def teardown() -> None:
    """Leave the process group, and free it now, while the interpreter is fully alive.

    destroy_process_group() frees the group only if nothing else holds it. torch's
    torch.distributed.nn.functional binds `group.WORLD` as a default argument when it is
    first imported, and DistributedDataParallel and the first optimizer step import it (via
    torch._dynamo): imported after init_process_group, it would keep the gloo group, its
    worker and socket threads alive until interpreter shutdown, where tearing them down
    can abort (SIGABRT), more often when a peer has already exited. Importing it at the top
    of this module, before any group exists, binds None instead.
    """
    global _serves
    if dist.is_available() and dist.is_initialized():
        gc.collect()  # DDP wrappers sit in reference cycles: free them while the group lives
        dist.destroy_process_group()
    _serves = ()


# What gloo, NCCL and the rendezvous store say when the process of another rank is gone
# (killed, crashed, its machine lost): the collective that waited on it fails with these.
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Connection closed by remote peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
    "failed to recv, got 0 bytes",
)


class RankFailed(RuntimeError):
    """Raised on the other ranks when rank 0 failed with an error that is not bad input (a
    bug, whose traceback rank 0 shows): their one line (lost_peer)."""


def lost_peer(exc: BaseException) -> str | None:
    """One line for a collective that failed because another rank's process is gone (under
    torchrun `kill -9` of one rank gave the others a 50-130-line traceback) or failed
    (RankFailed), or None for any other error. With two ranks the lost one is the other; with
    more, gloo names an address, not a rank."""
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    seen = []
    while exc is not None and exc not in seen and world_size > 1:
        seen.append(exc)
        if isinstance(exc, RankFailed):
            return str(exc)
        if isinstance(exc, RuntimeError) and any(text in str(exc) for text in PEER_LOST):
            who = f"rank {1 - rank}" if world_size == 2 else "another rank"
            return (
                f"{who} is gone (rank {rank} lost its connection to it); the last checkpoint "
                "is kept; rerun with train.resume=auto to continue from it"
            )
        exc = exc.__cause__ or exc.__context__
    return None


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def _check_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, if the process group serves its device type. NCCL serves CUDA tensors only: a
    tensor made without device= (on the CPU) fails there, deep in torch, and only on GPUs. This
    check fails the same way on any machine (the tests run the collectives' callers with new
    tensors on meta by default), naming the fix."""
    if _serves and tensor.device.type not in _serves:
        raise RuntimeError(
            f"a collective got a tensor on {tensor.device.type}, but the process group serves "
            f"{' and '.join(_serves)} tensors only; create it on the run's device (device=...)"
        )
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (sums and counts, never per-rank means)."""
    if is_distributed():
        dist.all_reduce(_check_device(tensor), op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_sums(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum each named tensor (a task's sums: scalars and per-target vectors) over ranks with
    one collective: flattened into one tensor in key order, which every rank shares whatever
    order its dict was built in, then split back."""
    keys = sorted(sums)
    flat = all_reduce_sum(torch.cat([sums[k].reshape(-1) for k in keys]))
    parts = flat.split([sums[k].numel() for k in keys])
    return {k: part.view_as(sums[k]) for k, part in zip(keys, parts, strict=True)}


def all_gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every rank's rows (N_rank, ...) concatenated in rank order, on every rank; the ranks
    may hold different numbers of rows (uneven shards, a rank with none)."""
    if not is_distributed():
        return rows
    rows = _check_device(rows.contiguous())
    count = torch.tensor([len(rows)], dtype=torch.int64, device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    padded = rows.new_zeros((max(sizes), *rows.shape[1:]))  # all_gather needs equal sizes
    padded[: len(rows)] = rows
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        dist.all_reduce(_check_device(tensor), op=dist.ReduceOp.MAX)
    return tensor


def broadcast(tensors, src: int = 0) -> None:
    """Give every rank rank `src`'s values of `tensors`, in place."""
    if is_distributed():
        for tensor in tensors:
            dist.broadcast(_check_device(tensor), src=src)


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics). DDP does so before each
    training forward, but the last step leaves each rank with statistics of its own batch."""
    broadcast(model.buffers())


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (the others pass anything, e.g. None)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj) -> list:
    """Gather a picklable object from every rank (e.g. per-rank RNG states for a checkpoint)."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


class StopVote:
    """When ranks compare stop requests. A signal reaches the ranks at different steps, and
    all must stop at the same one; comparing costs a collective that waits for the GPU, so not
    every step, and not only every log step either (minutes apart when steps are long, past
    SLURM's warning). The ranks vote about every `seconds` of training: the interval in steps
    comes from the slowest rank's step time, measured between votes, so every rank computes
    the same next vote and a stop is taken within `seconds` plus one step."""

    def __init__(self, stop: StopSignal, device: torch.device, step: int, seconds: float = 2.0):
        self.stop, self.device, self.seconds = stop, device, seconds
        self.next_step = step + 1
        self._since = (step, time.perf_counter())

    def due(self, step: int) -> bool:
        if not is_distributed():  # one process: act on a signal at once
            return self.stop.requested
        return step >= self.next_step

    def __call__(self, step: int) -> bool:
        """Every rank calls this at the same step; True when any rank was asked to stop."""
        if not is_distributed():
            return self.stop.requested
        last_step, last_time = self._since
        now = time.perf_counter()
        per_step = (now - last_time) / max(step - last_step, 1)
        local = torch.tensor([float(self.stop.requested), per_step], device=self.device)
        any_stop, slowest = all_reduce_max(local).tolist()
        self.next_step = step + max(1, int(self.seconds / max(slowest, 1e-6)))
        self._since = (step, now)
        return bool(any_stop)
