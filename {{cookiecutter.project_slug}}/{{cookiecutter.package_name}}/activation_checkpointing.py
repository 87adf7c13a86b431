"""train.activation_checkpointing: each block of the model (models.blocks()) recomputes its
activations in backward instead of keeping them (parallel.py calls checkpoint_blocks() on the
model it replicates; fsdp.py on the model it shards), BatchNorm's running statistics counted  # feature: fsdp
model it replicates), BatchNorm's running statistics counted  # feature: !fsdp
once per batch as without it."""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .models import blocks


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """`model`, changed in place: each block's activations recomputed in backward instead of
    kept (train.activation_checkpointing). Each block's class becomes a subclass whose forward
    runs under torch.utils.checkpoint (as fully_shard swaps in FSDP<Class>): parameter names,  # feature: fsdp
    runs under torch.utils.checkpoint: parameter names,  # feature: !fsdp
    the state dict and copies stay as they were, and torch.compile traces it (the composable
    checkpoint's hooks gave a compiled forward and an eager recomputation that saved other
    tensors: a CheckpointError at the first step)."""
    for block in blocks(model):
        block.__class__ = _checkpointed_class(type(block))
    return model


@functools.cache
def _checkpointed_class(cls: type) -> type:
    return type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), {})


class _Checkpointed:
    def forward(self, *args, **kwargs):
        return checkpoint(self._checkpointed_forward, *args, use_reentrant=False, **kwargs)

    def _checkpointed_forward(self, *args, **kwargs):
        # Run eagerly inside backward, this is the recomputation, BatchNorm in training mode:
        # it would update the running statistics and num_batches_tracked a second time per
        # step (pytorch#96136), so they are put back. Compiled, the block is one traced region
        # whose recomputation replays no buffer update (is_compiling() holds while tracing).
        if not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1:
            with _statistics_kept(self):
                return super().forward(*args, **kwargs)
        return super().forward(*args, **kwargs)


@contextlib.contextmanager
def _statistics_kept(block: nn.Module):
    # A copy, not momentum=0: that would leave num_batches_tracked counting, and turning the
    # statistics off would change what backward saves (checkpoint refuses that).
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._NormBase)]
    buffers = [b for norm in norms for b in norm.buffers(recurse=False)]
    kept = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, kept, strict=True):
                buffer.copy_(value)
