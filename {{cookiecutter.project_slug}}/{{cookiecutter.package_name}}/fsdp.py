"""train.strategy=fsdp: FSDP2 (torch.distributed.fsdp.fully_shard). Each rank holds
1/world_size of the parameters, gradients and optimizer state, and gathers a block's
parameters only while that block computes. Start at shard().

The trainer calls shard() instead of parallel.replica() before building the optimizer,
even_batches() on the validation loader and memory_report() once; parallel.py's no_sync()
and clip_grad_norm_() serve sharded models too. Sharded checkpoints are
checkpoint/sharded.py's.

FSDP and DTensor are imported inside the functions that use them:
at the top of this file they cost every run about a second of start-up, fsdp or not.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn

from . import distributed
from .config import TrainConfig
from .data import empty_batch
from .errors import ConfigError, UserError, first_line
from .models import blocks
from .utils.device import AMP_DTYPES, peak_memory, torch_older_than


def check_device(train: TrainConfig, device: torch.device) -> None:
    """Refuse, before the model is built, what fsdp cannot do on this device or torch."""
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
    # FSDP2 on the CPU calls stream methods that torch.cpu.Stream has from 2.7 on.
    if device.type == "cpu" and torch_older_than(2, 7):
        raise ConfigError(
            f"train.strategy=fsdp on the CPU needs torch >= 2.7 (this is {torch.__version__}); "
            "upgrade torch, train on CUDA GPUs, or use train.strategy=ddp"
        )


def shard(build, build_full, train: TrainConfig, device: torch.device) -> nn.Module:
    """The model sharded under fsdp: each block, then the root (which holds what no block
    does), activations checkpointed when asked; rank 0 prints start_up_report(). Build the
    optimizer afterwards, over the shards.

    `build()` makes the model; it runs on the meta device, so no rank ever holds the whole
    model on `device`. `build_full()` makes it with its weights, in host memory, on rank 0
    only: each rank receives its shards of that, one tensor at a time, so that fsdp starts
    from the weights ddp does (rank 0's seeded init, or train.init_from's)."""
    from torch.distributed import fsdp
    from torch.distributed.device_mesh import init_device_mesh

    check_device(train, device)
    if not dist.is_initialized():
        # One process without torchrun: a one-rank group, so that fsdp trains, saves and
        # resumes the same way on one process as on many (and reads their checkpoints).
        distributed.join_alone(device, cpu_collectives=train.cpu_offload)
    before = peak_memory(device)
    full = _on_rank_0(build_full)
    with torch.device("meta"):
        model = build().to(memory_format=torch.contiguous_format)  # what FSDP shards: see below
    if train.activation_checkpointing:
        from .activation_checkpointing import checkpoint_blocks

        checkpoint_blocks(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # Compute in train.amp's dtype, reduce gradients in fp32, keep fp32 shards for the optimizer.
    param_dtype = AMP_DTYPES.get(train.amp)
    options = dict(
        mesh=mesh,
        mp_policy=fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        offload_policy=fsdp.CPUOffloadPolicy() if train.cpu_offload else fsdp.OffloadPolicy(),
    )
    if param_dtype is not None:
        _shard_batch_norms(model, options)
    for block in blocks(model):  # a norm layer found as a block is sharded already (above)
        if not isinstance(block, fsdp.FSDPModule):
            fsdp.fully_shard(block, **options)
    fsdp.fully_shard(model, **options)
    _materialise(model, full, device, train.cpu_offload)
    report = start_up_report(before, device)  # what no rank may exceed to start
    if dist.get_rank() == 0:
        print(report)
    return model


def _on_rank_0(make):
    """make() on rank 0, None on the others. Its error stops every rank, none left waiting for
    weights that never come: a UserError (a model that cannot run on the data, a bad
    init_from) with that one line, as when every rank made it; any other error (a bug) with
    its traceback on rank 0 and one line naming it on the others."""
    made, error = None, None
    if dist.get_rank() == 0:
        try:
            made = make()
        except Exception as exc:
            error = exc
    told = error  # what the other ranks raise: an exception that pickles
    if error is not None and not isinstance(error, UserError):
        told = distributed.RankFailed(
            f"rank 0 failed building the model ({type(error).__name__}: {first_line(error)}); "
            "see rank 0's output"
        )
    told = distributed.broadcast_object(told)
    if error is not None:
        raise error
    if told is not None:
        raise told
    return made


def _materialise(model: nn.Module, full: nn.Module | None, device, offload: bool) -> None:
    """Allocate the meta model's shards and buffers, and fill them from rank 0's `full`. FSDP
    shards contiguous parameters only: channels_last weights are copied into the default
    layout. The inputs stay channels_last (loop.py), and a convolution given channels_last
    input computes and returns channels_last (cuDNN and oneDNN alike) whatever its weights'."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # Offloaded shards live in CPU memory (FSDP checks it); buffers join the GPU afterwards.
    model.to_empty(device="cpu" if offload else device)
    state = full.state_dict() if full is not None else {}
    every = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=every)
    with torch.no_grad():  # buffers outside the state dict (persistent=False) too
        for prefix, module in model.named_modules():
            for name in module._non_persistent_buffers_set:
                buffer = module.get_buffer(name)
                if full is not None:
                    buffer.copy_(full.get_submodule(prefix).get_buffer(name))
                distributed.broadcast([buffer])
    if offload:
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = buffer.to(device)


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


def is_dtensor(tensor: torch.Tensor) -> bool:
    # As is_sharded(): a DTensor exists only once torch.distributed.tensor was imported.
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def start_up_report(before: dict[str, float], device: torch.device) -> str:
    """A collective: what building and sharding the model raised each rank's peaks by, from
    `before` (utils.device.peak_memory() before the build), as one line for rank 0 to print."""
    grown = {key: value - before.get(key, 0.0) for key, value in peak_memory(device).items()}
    parts = [
        f"rank {rank} " + ", ".join(f"{key} +{value:.0f} MB" for key, value in peaks.items())
        for rank, peaks in enumerate(distributed.all_gather_object(grown))
    ]
    return f"start-up peak memory per rank (building and sharding the model): {'; '.join(parts)}"


def trainable_changed(model: nn.Module) -> None:
    """After parameters were frozen or unfrozen (train.freeze_epochs): FSDP2 resolves each
    parameter group's mixed-precision dtypes once, at the first forward, from the parameters
    trainable then, so a group frozen at that time reduces its later gradients in bf16 and
    fails to assign them to fp32 shards (pytorch/pytorch#186998, fixed upstream by #187376).
    Resolve them again from the parameters trainable now (idempotent: the first forward
    resolves them again itself)."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        resolve = getattr(group, "_init_mp_dtypes", None)  # torch's own, private: guarded
        if resolve is not None:
            resolve()


@contextlib.contextmanager
def no_gradient_sync(net: nn.Module):
    """parallel.no_sync() of a sharded model (an FSDPModule)."""
    net.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        net.set_requires_gradient_sync(True)


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
    return param.to_local() if is_dtensor(param) else param


def _mb(size: int) -> str:
    return f"{size / 2**20:.2f} MB"
