"""How the ranks share the model under train.strategy=ddp: a full copy per rank, in
DistributedDataParallel on several ranks. Start at replica().

The trainer calls, in order: replica() before building the optimizer, wrap() at each epoch's
start, no_sync() and clip_grad_norm_() in each step.
# >>> fsdp
Under train.strategy=fsdp, fsdp.shard() takes replica()'s place; the others serve both.
# <<< fsdp
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import distributed
from .config import TrainConfig
from .errors import ConfigError
from .fsdp import is_dtensor, is_sharded, no_gradient_sync, trainable_changed  # feature: fsdp


def replica(model: nn.Module, train: TrainConfig, device: torch.device, ranks: int) -> nn.Module:
    """ddp: the full model as each rank holds it, on `device`: SyncBatchNorm across the ranks,
    channels_last weights and activation checkpointing when asked."""
    if train.sync_bn and ranks > 1:
        if device.type != "cuda":  # DDP refuses SyncBatchNorm on CPU modules
            raise ConfigError("train.sync_bn=true needs CUDA GPUs; set train.sync_bn=false")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    memory_format = torch.channels_last if train.channels_last else torch.preserve_format
    model = model.to(device, memory_format=memory_format)
    if not train.activation_checkpointing:
        return model
    from .activation_checkpointing import checkpoint_blocks

    return checkpoint_blocks(model)


def wrap(model: nn.Module, train: TrainConfig, ranks: int, device: torch.device) -> tuple:
    """(ddp, net): `model` in DistributedDataParallel on several ranks (not with
    train.micro_batch_size: microbatch.py), and what the forward pass calls, compiled when
    train.compile. Built again when the trainable parameters change (finetune.set_epoch):
    ddp syncs those it was built with."""
    ddp, ids = model, [device] if device.type == "cuda" else None
    # >>> fsdp
    if is_sharded(model):  # fsdp syncs its shards itself: nothing to wrap
        ranks = 1
        trainable_changed(model)  # its mixed-precision dtypes follow requires_grad
    # <<< fsdp
    if ranks > 1 and train.micro_batch_size:  # microbatch.py reduces the gradients itself
        distributed.broadcast([*model.parameters(), *model.buffers()])  # as DDP starts: equal
    elif ranks > 1:
        ddp = DistributedDataParallel(model, device_ids=ids)
    return ddp, torch.compile(ddp) if train.compile else ddp


def no_sync(net: nn.Module, skip: bool):
    """While `skip` (micro-steps before the last of an accumulation), backward accumulates
    gradients on each rank without reducing them across ranks."""
    if skip and isinstance(net, DistributedDataParallel):
        return net.no_sync()
    # >>> fsdp
    if skip and is_sharded(net):
        return no_gradient_sync(net)
    # <<< fsdp
    return contextlib.nullcontext()


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ over every rank's gradients, as a plain tensor equal on every
    rank."""
    norm = nn.utils.clip_grad_norm_(params, max_norm)
    # >>> fsdp
    if is_dtensor(norm):  # fsdp: the global norm of sharded gradients, as a DTensor
        norm = norm.full_tensor()
    # <<< fsdp
    return norm
