"""The epoch loop: train an epoch, validate, save a checkpoint, report; until the last epoch,
early stopping or a stop (a signal, train.max_steps), which saves where it is, mid-epoch too.

trainer.train() builds what the loop works on: a Loop of the run's Data (data, task), its
Trainee (model, optimizer, schedule) and where it stands (Progress)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from . import checkpoint, distributed, finetune, microbatch, parallel
from .checkpoint import CheckpointManager, Progress
from .config import TrainConfig
from .data import set_epoch
from .distributed import DistInfo
from .nonfinite import read_losses, skip_step
from .summary import report_epoch
from .utils.device import autocast, to_device
from .utils.logger import MetricLogger
from .utils.signals import StopSignal
from .validation import evaluate, notes


@dataclass
class Data:
    """What the run trains and validates on, and the task that scores it."""

    train_set: Dataset
    val_set: Dataset
    train_loader: DataLoader  # this rank's shard; resumable mid-epoch (data/sampler.py)
    val_loader: DataLoader
    task: object  # the loss and the metrics (tasks/)
    example: torch.Tensor  # the first training inputs: what the model was built and tried on
    example_y: torch.Tensor  # and their targets: the task was tried on both (tasks/protocol.py)
    meta: dict  # what prediction needs to read new inputs (classes, normalisation), saved
    io: dict  # the model's input shape and dtype and output size (models.model_io), saved
    loader_args: dict  # how this rank's loaders are built: the test split's too (build_loader)
    steps_per_epoch: int
    effective_batch: int  # batch_size x grad_accum_steps x ranks: samples per optimizer step


@dataclass
class Trainee:
    """What is trained, and saved in every checkpoint."""

    model: nn.Module  # the plain module (or its FSDP shards): what is saved and evaluated  # feature: fsdp
    model: nn.Module  # the plain module: what is saved and evaluated  # feature: !fsdp
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    lr: float  # the peak learning rate, after train.lr_scaling
    ema: nn.Module | None = None  # train.ema_decay: the weights' average (ema.py), validated
    ddp: nn.Module | None = None  # `model` inside DistributedDataParallel on >1 rank (ddp)
    net: nn.Module | None = None  # what the forward pass calls: `ddp`, compiled on request


@dataclass
class Loop:
    """One run in progress: its own settings (not the whole Config: trainer.py picks them),
    data, trainee, position, logger and stop signal."""

    train: TrainConfig
    log_every: int  # run.log_every: steps between loss reads
    model_name: str  # model.name: which modules fine-tuning calls the head (finetune.py)
    best: tuple[str, str]  # the val metric that picks best.pt, and max or min (Config.best)
    tie: tuple[str, str]  # the metric that breaks its ties (Config.tie_break)
    run_dir: Path  # where train.py --profile writes
    dist: DistInfo
    device: torch.device
    data: Data
    trainee: Trainee
    progress: Progress
    log: MetricLogger
    stop: StopSignal
    vote: distributed.StopVote  # the ranks agree on a stop every couple of seconds
    said: set = field(default_factory=set)  # the validation notes printed
    hooks: list = field(default_factory=list)  # called after each step: train.py --profile


def run_epochs(loop: Loop, ckpts: CheckpointManager) -> tuple[dict, str | None]:
    """Train an epoch, validate, checkpoint; until the last epoch, early stopping, or a stop.
    train.max_steps ends the run where it falls, validated (mid-epoch too); a signal saves
    where it is and returns at once. Returns the last validation metrics and stop reason."""
    train, progress = loop.train, loop.progress
    metrics = {}
    for epoch in range(progress.epoch, train.epochs):
        progress.epoch, t = epoch, loop.trainee
        set_epoch(loop.data.train_loader, epoch, start=progress.epoch_samples)
        if finetune.set_epoch(t.model, train, epoch, loop.model_name):  # frozen or not
            t.ddp, t.net = parallel.wrap(t.model, train, loop.dist.world_size, loop.device)
        start = time.perf_counter()
        stats, stopped = train_one_epoch(loop)
        train_time = time.perf_counter() - start
        if not stats["finished"] and stopped != "max_steps":  # a signal: no time to validate
            save(loop, ckpts, is_best=False)
            return metrics, stopped
        metrics = validate_and_save(loop, ckpts, stats, train_time)
        if not stopped and epoch + 1 < train.epochs:
            stopped = checkpoint.complete_reason(train, progress)  # early stopping (bad_epochs)
        if stopped:
            return metrics, stopped
    return metrics, None


def validate_and_save(
    loop: Loop, ckpts: CheckpointManager, stats: dict, train_time: float
) -> dict:
    """Validate the model as it is, save it (best.pt too when it improves) and report: at the
    end of an epoch, or where train.max_steps ends the run mid-epoch, so that the summary,
    runs.csv and best.pt describe the final model. Returns the metrics."""
    progress, data = loop.progress, loop.data
    best_metric, best_mode = loop.best
    # The weights' average when train.ema_decay is on; every rank evaluates the BatchNorm
    # statistics it saves.
    model = loop.trainee.ema.module if loop.trainee.ema is not None else loop.trainee.model
    distributed.sync_buffers(model)
    split = f"the validation split at step {progress.step}"
    rows = 2 * progress.micro_batch  # as the loaders: validation batches are twice as large
    args = (model, data.val_loader, data.task, loop.device, loop.train.amp)
    metrics = evaluate(*args, split=split, rows=rows)
    for line in notes(data.task, metrics, best_metric, loop.said) if loop.dist.is_main else ():
        tqdm.write(line)
    if stats["finished"]:
        progress.epoch, progress.epoch_samples = progress.epoch + 1, 0
    # A part of an epoch is no epoch for early stopping; a resume continues that epoch.
    tie_metric, tie_mode = loop.tie  # equal best values: the lower loss wins
    tie = (metrics[tie_metric], tie_mode)
    delta = loop.train.early_stop_min_delta
    is_best = progress.improves(metrics[best_metric], best_mode, delta, stats["finished"], tie=tie)
    progress.train_seconds += train_time
    progress.samples += stats["samples"]
    progress.metrics = metrics
    save(loop, ckpts, is_best, partial(report_epoch, loop, stats, metrics, train_time, is_best))
    return metrics


def train_one_epoch(loop: Loop) -> tuple[dict, str | None]:
    """Train to the end of the epoch or until a stop is due (signal, train.max_steps).

    Returns the stats of the steps trained ("finished": whether the epoch ended) and the stop
    reason."""
    train, progress, accum = loop.train, loop.progress, loop.train.grad_accum_steps
    loader = loop.data.train_loader
    finetune.train_mode(loop.trainee.net, loop.trainee.model, train, progress.epoch)
    done = progress.epoch_samples // loop.data.effective_batch  # steps this epoch before a resume
    micro_left = len(loader)  # the micro-batches left in this epoch (the loader starts there)
    steps_left = min(loop.data.steps_per_epoch - done, -(-micro_left // accum))
    batches = iter(loader)
    # Losses stay on the device, detached, until the next log: reading one (.item()) waits
    # for the GPU, so it happens only every run.log_every steps; collecting them never waits.
    losses: list[torch.Tensor] = []
    params = list(loop.trainee.net.parameters())  # walked once: ~50 us a walk of the tree
    since_log, epoch_loss, epoch_steps, stopped = 0, 0.0, 0, None
    first_sample = progress.epoch_samples
    bar = progress_bar(loop, done)
    finished = True  # also when a resumed epoch has nothing left to do
    for i in range(steps_left):
        # The epoch's last step takes the micro-batches left, fewer than accum: none is dropped.
        micro = min(accum, micro_left)
        micro_left -= micro
        loss, grad_norm = train_step(loop, batches, micro, params)
        losses.append(loss)
        progress.step += 1
        progress.epoch_samples += loop.data.effective_batch // accum * micro
        since_log += 1
        bar.update()
        for hook in loop.hooks:
            hook(loop)

        last = i == steps_left - 1
        at_limit = 0 < train.max_steps <= progress.step
        log_now = progress.step % loop.log_every == 0 or last or at_limit
        if not log_now and loop.vote.due(progress.step):
            # Ranks compare stop requests every ~2 s (StopVote); a stop logs like an interval.
            log_now = loop.vote(progress.step)
        if log_now:
            avg, any_stop = log_interval(loop, losses, since_log, grad_norm, bar)
            epoch_loss, epoch_steps = epoch_loss + avg * since_log, epoch_steps + since_log
            losses.clear()
            since_log = 0
            if any_stop:
                stopped = loop.stop.reason or "signal on another rank"
        if at_limit:  # the run is over: validated and complete, even if a signal came too
            stopped = "max_steps"
        if stopped:
            finished = last
            break
    bar.close()
    stats = {
        "loss": epoch_loss / max(epoch_steps, 1),
        "samples": progress.epoch_samples - first_sample,
        "finished": finished,
    }
    return stats, stopped


def progress_bar(loop: Loop, done: int) -> tqdm:
    """The epoch's bar on rank 0 (tqdm's own check hides it when the output is not a
    terminal), starting at the steps a resume has done."""
    return tqdm(
        total=loop.data.steps_per_epoch,
        initial=done,
        leave=False,
        dynamic_ncols=True,
        disable=None if loop.dist.is_main else True,
        desc=f"epoch {loop.progress.epoch + 1}/{loop.train.epochs}",
    )


def log_interval(loop: Loop, losses: list, steps: int, grad_norm, bar: tqdm) -> tuple:
    """Read the last `steps` losses (the one wait for the GPU per interval), log them with
    the lr and gradient norm, and show them on the bar. Returns (mean loss, any rank asked
    to stop)."""
    avg, any_stop = read_losses(loop, losses, steps)
    lr = loop.trainee.scheduler.get_last_lr()[0]
    loop.log.scalars(
        loop.progress.step,
        {"train/loss": avg, "train/lr": lr, "train/grad_norm": float(grad_norm)},
    )
    bar.set_postfix(loss=f"{avg:.4f}", lr=f"{lr:.2e}", refresh=False)
    return avg, any_stop


def train_step(loop: Loop, batches, micro_batches: int, params: list) -> tuple:
    """One optimizer step on the next `micro_batches` batches, their gradients accumulated.
    Returns the step's mean loss (on the device, detached) and the gradient norm."""
    train, trainee = loop.train, loop.trainee
    if loop.progress.micro_batch:  # train.micro_batch_size: batches cut, backing off on OOM
        loss = microbatch.accumulate(loop, [next(batches) for _ in range(micro_batches)])
    else:
        loss = accumulate(loop, batches, micro_batches)
    trainee.scaler.unscale_(trainee.optimizer)  # clip the true gradients, not fp16-scaled ones
    grad_norm = parallel.clip_grad_norm_(params, train.grad_clip or math.inf)
    if train.on_nonfinite == "skip" and skip_step(loop, loss, grad_norm):  # nonfinite.py
        trainee.scaler.update()  # fp16: the scale backs off, as for the scaler's own skips
        trainee.optimizer.zero_grad(set_to_none=True)
        return torch.full_like(loss, math.nan), grad_norm  # left out of the logged mean
    trainee.scaler.step(trainee.optimizer)  # skipped when fp16 gradients overflowed (no error)
    trainee.scaler.update()
    trainee.optimizer.zero_grad(set_to_none=True)
    trainee.scheduler.step()
    if trainee.ema is not None:
        trainee.ema.update_parameters(trainee.model)
    return loss, grad_norm


def accumulate(loop: Loop, batches, micro_batches: int) -> torch.Tensor:
    """Forward and backward over the next `micro_batches` batches, their gradients summed
    (DDP reduces them across ranks in the last backward). Returns their mean loss (detached)."""
    trainee, device, channels_last = loop.trainee, loop.device, loop.train.channels_last
    mixed_precision = autocast(device, loop.train.amp)
    total = None
    for micro in range(micro_batches):
        x, y = to_device(next(batches), device)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        # Reduce gradients across ranks only on the last micro-step of an accumulation.
        with parallel.no_sync(trainee.ddp, skip=micro < micro_batches - 1):
            with mixed_precision:
                loss = loop.data.task.loss(trainee.net(x), y)
            # Divide so the accumulated gradient is the mean over the step's micro-batches
            # (the epoch's last step may have fewer than train.grad_accum_steps); not by 1:
            # that is an op per step, and a node in backward.
            scaled = loss / micro_batches if micro_batches > 1 else loss
            trainee.scaler.scale(scaled).backward()
        total = scaled.detach() if total is None else total + scaled.detach()
    return total


def save(loop: Loop, ckpts: CheckpointManager, is_best: bool, report=None) -> None:
    # A collective: every rank calls it. A resume continues the same tracker runs. `report`
    # (the epoch's row) is written before the checkpoint is named: a kill loses no row.
    ckpts.check_held()
    extra = {"data": loop.data.meta, "io": loop.data.io, "trackers": loop.log.tracker_ids()}
    ckpts.save(loop.trainee, loop.progress, extra, is_best, report)
