"""train.micro_batch_size: each batch of train.batch_size goes through forward and backward
in micro-batches, so a batch larger than the GPU's memory trains as one step; with `auto`
the micro-batch starts at the whole batch and halves on out-of-memory, at any step.

The global batch (train.batch_size x grad_accum_steps x ranks) and so the optimisation stay
as configured: each micro-batch's mean loss is weighted by its share of the batch, so the
step's gradient is the batch's mean as with no micro-batches (the same math, summed in
another order: equal within float rounding, not bitwise; BatchNorm sees smaller batches).

On out-of-memory every rank drops the step's gradients and runs the step again at half the
micro-batch, together: after the step's micro-batches the ranks all-reduce an out-of-memory
flag, and only then the gradients (here, as one collective per bucket, not DDP's: DDP's
collectives inside backward would wait for a rank that left its backward with the error).
The micro-batch in force is saved in the checkpoint (Progress.micro_batch): a resume does
not search again. At a micro-batch of 1 the run stops with one line."""

from __future__ import annotations

import torch
from tqdm import tqdm

from . import distributed
from .errors import UserError
from .utils.device import autocast, to_device

FIXES = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, train.amp=bf16, "
    "train.activation_checkpointing=true, a smaller model"
)
BUCKET = 2**24  # gradient elements per collective (64 MB of float32): a bounded extra copy


class OutOfMemory(UserError):
    pass


def in_force(train, saved: int) -> int:
    """The micro-batch this run steps with (0: the whole batch, no splitting): a number's,
    or for `auto` the one a resumed run had backed off to (`saved`), else the whole batch."""
    if train.micro_batch_size == "auto":
        return saved if 0 < saved <= train.batch_size else train.batch_size
    return train.micro_batch_size


def is_oom(err: BaseException) -> bool:
    """CUDA's out-of-memory error, and the CPU allocator's and Apple MPS's (RuntimeErrors)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "MPS backend out of memory" in text
    )


def accumulate(loop, batches: list) -> torch.Tensor:
    """Forward and backward over the step's `batches` in micro-batches of
    loop.progress.micro_batch, their gradients averaged over ranks; on out-of-memory on any
    rank, again at half the micro-batch. Returns the step's mean loss (detached)."""
    while True:
        oom = ""
        try:
            total = _forward_backward(loop, batches, loop.progress.micro_batch)
        except RuntimeError as err:
            if not is_oom(err):
                raise
            oom = str(err).splitlines()[0]  # the error's frames (and activations) go now
        if loop.dist.world_size > 1:  # every rank, out of memory or not: they agree
            flag = torch.tensor([float(bool(oom))], device=loop.device)
            anyone = distributed.all_reduce_max(flag).item() > 0  # called on every rank
            oom = oom or ("on another rank" if anyone else "")
        if not oom:
            reduce_gradients(loop.trainee.model, loop.dist.world_size)
            return total
        _back_off(loop, oom)


def _forward_backward(loop, batches: list, size: int) -> torch.Tensor:
    trainee, device = loop.trainee, loop.device
    mixed_precision = autocast(device, loop.train.amp)
    total = torch.zeros((), device=device)
    for batch in batches:
        x, y = to_device(batch, device)
        for xs, ys in parts(x, y, size):
            if loop.train.channels_last and xs.dim() == 4:
                xs = xs.contiguous(memory_format=torch.channels_last)
            with mixed_precision:
                loss = loop.data.task.loss(trainee.net(xs), ys)
            # The step's mean: each micro-batch by its share of its batch, of the batches.
            weight = len(xs) / len(x) / len(batches)
            trainee.scaler.scale(loss * weight).backward()
            total = total + loss.detach().float() * weight
    return total


def parts(x: torch.Tensor, y: torch.Tensor, rows: int):
    """(x, y) in parts of at most `rows` samples, in order (0: whole)."""
    if not rows or len(x) <= rows:
        yield x, y
        return
    for start in range(0, len(x), rows):
        yield x[start : start + rows], y[start : start + rows]


def _back_off(loop, why: str) -> None:
    """Drop the step's gradients and memory, and halve the micro-batch (or stop at 1)."""
    progress, trainee = loop.progress, loop.trainee
    trainee.optimizer.zero_grad(set_to_none=True)
    if loop.device.type == "cuda":
        torch.cuda.empty_cache()
    size = progress.micro_batch
    if size <= 1 or loop.train.micro_batch_size != "auto":
        raise OutOfMemory(
            f"out of memory at step {progress.step + 1} with a micro-batch of {size} "
            f"(train.micro_batch_size={loop.train.micro_batch_size}): {why}; try "
            + ("train.micro_batch_size=auto, " if size > 1 else "")
            + FIXES
        )
    progress.micro_batch = size // 2
    if loop.dist.is_main:
        tqdm.write(
            f"out of memory at step {progress.step + 1} with a micro-batch of {size}: "
            f"the step runs again at {progress.micro_batch} (train.micro_batch_size=auto)"
        )


def reduce_gradients(model: torch.nn.Module, ranks: int) -> None:
    """The mean of every rank's gradients, in place, in buckets of one dtype (what DDP does
    inside backward; here after it, once every rank has finished its micro-batches)."""
    if ranks < 2:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket: list[torch.Tensor] = []
    for i, grad in enumerate(grads):
        bucket.append(grad)
        after = grads[i + 1] if i + 1 < len(grads) else None
        full = sum(g.numel() for g in bucket) >= BUCKET
        if after is None or full or after.dtype != grad.dtype or after.device != grad.device:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            distributed.all_reduce_sum(flat).div_(ranks)
            for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(part.view_as(g))
            bucket = []


def memory_columns(loop) -> dict:
    """An epoch's metrics.csv columns: the micro-batch in force, and on CUDA the caching
    allocator's retries (frees and retries after a failed allocation: memory thrashing)."""
    row = {"train/micro_batch": loop.progress.micro_batch}
    if loop.device.type == "cuda":
        row["memory/alloc_retries"] = torch.cuda.memory_stats(loop.device)["num_alloc_retries"]
    return row


def note(train, progress) -> str:
    """The run's first line and the summary: the micro-batch in force, if any."""
    if not progress.micro_batch:
        return ""
    auto = " (auto)" if train.micro_batch_size == "auto" else ""
    return f" in micro-batches of {progress.micro_batch}{auto}"
