"""How the ranks share the model: train.strategy=ddp (a full copy per rank, trainer.py wraps
it in DistributedDataParallel) or fsdp (FSDP2, torch.distributed.fsdp.fully_shard: each rank
holds 1/world_size of the parameters, gradients and optimizer state, and gathers a block's
parameters only while that block computes). Start at wrap().

The trainer calls, in order: wrap() before building the optimizer, even_batches() on the
validation loader, memory_report() once, no_sync() and clip_grad_norm_() in each step. Sharded
checkpoints (save, restore, consolidate) are checkpoint/sharded.py's.

FSDP, DTensor and activation checkpointing are imported inside the functions that use them:
at the top of this file they cost every run about a second of start-up, fsdp or not.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import distributed
from .config import TrainConfig
from .data import empty_batch
from .errors import ConfigError


def wrap(model: nn.Module, train: TrainConfig, device: torch.device) -> nn.Module:
    """`model`, changed in place: each block's activations recomputed in backward (when
    train.activation_checkpointing) and, under fsdp, each block sharded, then the root (which
    holds what no block does). Build the optimizer afterwards, over the sharded parameters."""
    if train.strategy == "fsdp" and device.type not in ("cuda", "cpu"):
        raise ConfigError(
            f"train.strategy=fsdp runs on CUDA GPUs or the CPU, not {device.type}; use "
            "train.strategy=ddp"
        )
    if train.cpu_offload and device.type != "cuda":
        raise ConfigError(
            "train.cpu_offload=true needs CUDA GPUs (on the CPU everything is in CPU memory "
            "already); set train.cpu_offload=false"
        )
    found = blocks(model)
    if train.activation_checkpointing:
        from torch.distributed._composable import checkpoint as checkpoint_activations

        for block in found:  # composable: parameter names stay as they were
            norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._NormBase)]
            contexts = functools.partial(_recompute_contexts, norms)
            checkpoint_activations(block, context_fn=contexts)
    if train.strategy != "fsdp":
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    if not dist.is_initialized():
        # One process without torchrun: a one-rank group, so that fsdp trains, saves and
        # resumes the same way on one process as on many (and reads their checkpoints).
        distributed.join_alone(device, cpu_collectives=train.cpu_offload)
    # Each rank seeded its own streams (run.seed + rank): start from rank 0's weights, as
    # DistributedDataParallel does, before each rank keeps its part.
    with torch.no_grad():
        distributed.broadcast([*model.parameters(), *model.buffers()])
    # FSDP shards contiguous parameters only: channels_last weights go back to the default
    # layout. The inputs stay channels_last (loop.py), and a convolution given channels_last
    # input computes and returns channels_last (cuDNN and oneDNN alike) whatever its weights'.
    if train.channels_last:
        model.to(memory_format=torch.contiguous_format)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # bf16 compute with fp32 gradient reduction and fp32 sharded weights for the optimizer.
    param_dtype = torch.bfloat16 if train.amp == "bf16" else None
    options = dict(
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        offload_policy=CPUOffloadPolicy() if train.cpu_offload else OffloadPolicy(),
    )
    if param_dtype is not None:
        _shard_batch_norms(model, options)
    for block in found:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def _recompute_contexts(norms: list[nn.Module]):  # around the forward, around recomputing it
    return contextlib.nullcontext(), _statistics_kept(norms)


@contextlib.contextmanager
def _statistics_kept(norms: list[nn.Module]):
    """The recomputation in backward reruns the block's forward in training mode, BatchNorm
    included, which would update its running statistics and num_batches_tracked a second time
    per step (pytorch#96136): they are put back as the forward left them."""
    # The buffers are looked up now, not when the block was wrapped: fully_shard replaces
    # them. A copy, not momentum=0: that would leave num_batches_tracked counting, and
    # turning the statistics off would change what backward saves (checkpoint refuses that).
    buffers = [b for norm in norms for b in norm.buffers(recurse=False)]
    kept = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, kept, strict=True):
                buffer.copy_(value)


def _shard_batch_norms(model: nn.Module, options: dict) -> None:
    """Shard each BatchNorm on its own, its weights kept in fp32 (as torchtitan does, issue
    674): FSDP's mixed precision casts parameters, not buffers, and batch_norm refuses bf16
    weights beside fp32 running statistics. Its input is not cast: batch_norm takes a bf16
    input with fp32 weights and returns bf16, what the next layer's bf16 weights expect."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    fp32 = MixedPrecisionPolicy(
        param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            fully_shard(module, **{**options, "mp_policy": fp32})


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, the unit of sharding and of activation checkpointing.

    A model may name them with a method `fsdp_blocks()`. Otherwise they are the children of an
    nn.Sequential or nn.ModuleList that repeat one class and hold parameters (SmallCNN's
    ConvBlocks, the MLP's Linear layers), outermost first: a block's insides are not searched.
    """
    declared = getattr(model, "fsdp_blocks", None)
    if callable(declared):
        return list(declared())
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        children = [c for c in module.children() if next(c.parameters(), None) is not None]
        if isinstance(module, (nn.Sequential, nn.ModuleList)):
            counts = Counter(type(child) for child in children)
            found.extend(child for child in children if counts[type(child)] > 1)
            children = [child for child in children if counts[type(child)] == 1]
        for child in children:
            visit(child)

    visit(model)
    return found


def even_batches(loader, model: nn.Module, device: torch.device):
    """`loader`, or under fsdp a loader that yields as many batches on every rank (a
    collective: every rank calls it). Under fsdp each forward pass is a collective (a block
    gathers its parameters from every rank), but validation shards differ by up to a sample
    and so may differ by a batch: the ranks with fewer end with empty batches."""
    if not is_sharded(model):
        return loader
    most = distributed.all_reduce_max(torch.tensor(len(loader), device=device))
    return _EvenBatches(loader, int(most))


class _EvenBatches:
    def __init__(self, loader, count: int):
        self.loader, self.count = loader, count
        self.dataset = loader.dataset  # what evaluate() reads the sample shapes from

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        seen, empty = 0, None
        for batch in self.loader:
            seen, empty = seen + 1, _empty(batch)
            yield batch
        if seen == 0 and self.count:  # no sample on this rank: an empty batch of the right shapes
            empty = empty_batch(self.dataset)
        for _ in range(self.count - seen):
            yield empty  # no sample: adds nothing to the sums and counts of evaluate()


def _empty(batch):
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_empty(item) for item in batch)
    if isinstance(batch, dict):
        return {key: _empty(value) for key, value in batch.items()}
    return batch


def is_sharded(model: nn.Module) -> bool:
    # Only fully_shard makes a sharded model, and it imported FSDP: while FSDP is not imported,
    # no model is sharded, and a plain run does not import it to find that out.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    # As is_sharded(): a DTensor exists only once torch.distributed.tensor was imported.
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def no_sync(net: nn.Module, skip: bool):
    """While `skip` (micro-steps before the last of an accumulation), backward accumulates
    gradients on each rank without reducing them across ranks."""
    if skip and isinstance(net, DistributedDataParallel):
        return net.no_sync()
    if skip and is_sharded(net):
        return _no_gradient_sync(net)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _no_gradient_sync(net: nn.Module):  # an FSDPModule
    net.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        net.set_requires_gradient_sync(True)


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ over every rank's gradients. Under fsdp the norm comes back as a
    DTensor (the gradients are sharded); the clipping used the global norm, returned here as a
    plain tensor equal on every rank."""
    norm = nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if _is_dtensor(norm) else norm


def memory_report(model: nn.Module) -> str:
    """What each rank holds for parameters, gradients and AdamW's two moments, against the full
    copy every rank holds under ddp."""
    local = sum(_local(p).numel() * p.element_size() for p in model.parameters())
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    return (
        f"memory per rank (fsdp over {dist.get_world_size()}): params {_mb(local)} + grads "
        f"{_mb(local)} + optimizer {_mb(2 * local)} (AdamW: 2 per parameter); "
        f"ddp: {_mb(full)} + {_mb(full)} + {_mb(2 * full)}"
    )


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if _is_dtensor(param) else param


def _mb(size: int) -> str:
    return f"{size / 2**20:.2f} MB"
