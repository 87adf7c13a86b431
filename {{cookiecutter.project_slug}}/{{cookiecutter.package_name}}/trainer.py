"""The training loop. `fit(cfg)` reads top to bottom: setup, data, model, optimizer, resume,
loop (train an epoch, validate, checkpoint), summary.

The same code runs as one process (`python scripts/train.py`) and under torchrun, one process
per GPU (or CPU slot) with DistributedDataParallel, or sharded with FSDP (parallel.py); see
README.md for the launch commands.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from . import checkpoint, distributed, parallel, resume
from .checkpoint import Progress
from .config import Config, save_config, to_dict
from .data import (
    build_datasets,
    build_loader,
    check_split,
    close_loader,
    example_inputs,
    set_epoch,
    source_of,
)
from .distributed import DistInfo
from .errors import ConfigError, UserError
from .models import build_model, model_io
from .optim import build_optimizer, build_scheduler, continue_schedule, scaled_lr
from .run_folder import RunFolder
from .summary import summary
from .tasks import TASKS, build_task
from .utils.device import (
    autocast,
    check_amp,
    configure_backends,
    configure_threads,
    memory_mb,
    to_device,
)
from .utils.logger import MetricLogger, record_run
from .utils.seed import rng_state, seed_everything
from .utils.signals import StopSignal
from .utils.trackers import check_installed

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after saving; run again to resume
COMPLETE = (None, "max_steps", "early_stopping")  # stop reasons of a run with nothing left to do


class NonFiniteLoss(UserError):
    pass


@dataclass
class Loop:
    """What the epoch loop works on; built once by train()."""

    cfg: Config
    dist: DistInfo
    device: torch.device
    task: object  # the loss and the metrics (tasks/)
    data_meta: dict  # what prediction needs to read new inputs (classes, normalisation), saved
    io: dict  # the model's input shape and dtype and output size (models.model_io), saved
    model: nn.Module  # the plain module: what is saved and evaluated
    ddp: nn.Module  # `model` inside DistributedDataParallel under ddp on >1 rank, else `model`
    net: nn.Module  # what the forward pass calls: `ddp`, compiled when train.compile
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    progress: Progress
    steps_per_epoch: int
    effective_batch: int  # batch_size x grad_accum_steps x ranks: samples per optimizer step
    log: MetricLogger
    stop: StopSignal
    vote: distributed.StopVote


def fit(cfg: Config) -> dict:
    """Train as `cfg` says; returns the last validation metrics, where the run stopped and
    the trained model. Joins the process group under torchrun and leaves it at the end."""
    stop = StopSignal()
    stop.install()  # from the start: a signal during set-up stops the run after one step
    try:
        dist, device = distributed.setup(cfg.run.device)
        return train(cfg, dist, device, stop)
    finally:
        # Only once train()'s frame is gone, so that no DistributedDataParallel (whose gloo
        # work can hold Python objects) outlives the process group. The signal handlers stay
        # until after it: a second SIGTERM during the final save or teardown is only noted.
        distributed.teardown()
        stop.restore()


def train(cfg: Config, dist: DistInfo, device: torch.device, stop: StopSignal) -> dict:
    """The recipe: checks, data, model, optimizer, resume, then the epoch loop and summary."""
    started = time.perf_counter()
    # Everything is built and checked before anything is written: bad input leaves no trace.
    check_amp(cfg.train.amp, device)
    check_installed(cfg.run.loggers)  # wandb, mlflow: optional packages
    threads = configure_threads(cfg.run.threads)  # shared by the processes of this machine
    configure_backends(device, cfg.train.tf32, cfg.run.deterministic)
    seed_everything(cfg.run.seed + dist.rank, cfg.run.deterministic)

    train_set, val_set, data_meta, task = build_data(cfg)
    # Each rank reads its own shard; pinned memory only helps host-to-GPU copies.
    loader_args = dict(
        cfg=cfg.data,
        seed=cfg.run.seed,
        rank=dist.rank,
        world_size=dist.world_size,
        pin_memory=cfg.data.pin_memory and device.type == "cuda",
    )
    train_loader = build_loader(
        train_set, batch_size=cfg.train.batch_size, train=True, **loader_args
    )
    val_loader = build_loader(
        val_set, batch_size=2 * cfg.train.batch_size, train=False, **loader_args
    )
    steps_per_epoch = len(train_loader) // cfg.train.grad_accum_steps
    effective_batch = cfg.train.batch_size * cfg.train.grad_accum_steps * dist.world_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"the effective batch ({effective_batch} = train.batch_size x "
            f"train.grad_accum_steps x {dist.world_size} ranks) exceeds the "
            f"{len(train_set)} training samples; lower train.batch_size"
        )
    total_steps = steps_per_epoch * cfg.train.epochs

    model = build_net(cfg, train_set, task, device, dist)
    model = parallel.wrap(model, cfg.train, device)  # fsdp: sharded before the optimizer sees it
    val_loader = parallel.even_batches(val_loader, model)  # fsdp: forward passes in lockstep

    # Optimizer and schedule (optim.py): AdamW, per-step warm-up then cosine.
    lr = scaled_lr(cfg.train, effective_batch)
    optimizer = build_optimizer(model, cfg.train, lr, fused=device.type in ("cuda", "cpu"))
    scheduler = build_scheduler(optimizer, cfg.train, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
    progress = Progress()

    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    ckpts = RunFolder(run_dir, cfg.train.keep_last)
    log = MetricLogger(None)
    try:
        # Resume: continue this run exactly, or refuse to overwrite a run that exists.
        state = resume.load_state(cfg, dist, ckpts)
        if state is not None:
            changed = resume.changes(state, cfg)
            if data_meta.get("split"):  # the same validation rows as before the stop
                check_split(data_meta["split"], state.get("data"))
            parallel.restore(state, model, optimizer, cfg.train.strategy)  # sharded checkpoints
            checkpoint.restore_training_state(
                state, model, optimizer, scheduler, scaler, progress, dist.rank, dist.world_size
            )
            continue_schedule(optimizer, scheduler, cfg.train, lr, total_steps)
            if dist.is_main:
                checkpoint.note_batch_change(state, effective_batch)
                if changed:
                    print(f"settings changed since step {progress.step}: {', '.join(changed)}")
            reason = resume.complete_reason(cfg, progress)
            if reason:
                if dist.is_main:
                    print(
                        f"run {cfg.run.name} is complete; nothing to do. To train further, "
                        "resume with a larger train.epochs (or train.max_steps, or "
                        "train.early_stop_patience)"
                    )
                    print(summary(cfg, progress, reason, data_meta))
                stopped = None if reason == "finished" else reason
                return result(progress, progress.metrics, stopped, model)
        distributed.barrier()  # every rank has checked and loaded before rank 0 writes

        ddp = model
        if dist.world_size > 1 and not parallel.is_sharded(model):
            ddp = DistributedDataParallel(
                model, device_ids=[device] if device.type == "cuda" else None
            )
        net = torch.compile(ddp) if cfg.train.compile else ddp

        if dist.is_main:
            log = open_run_folder(cfg, ckpts, progress.step, (state or {}).get("trackers"))
            params = sum(p.numel() for p in model.parameters())
            print(
                f"run {cfg.run.name}: {cfg.model.name} {params / 1e6:.2f}M params | {device} x "
                f"{dist.world_size} | CPU threads {threads} | amp {cfg.train.amp} | effective "
                f"batch {effective_batch} | lr {lr:.2e} | {steps_per_epoch} steps/epoch"
                + (f" | resumed at step {progress.step}" if state else "")
            )
            if parallel.is_sharded(model):
                print(parallel.memory_report(model))
        loop = Loop(
            cfg=cfg,
            dist=dist,
            device=device,
            task=task,
            data_meta=data_meta,
            io=model_io(example_inputs(train_set), task.num_outputs),
            model=model,
            ddp=ddp,
            net=net,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            progress=progress,
            steps_per_epoch=steps_per_epoch,
            effective_batch=effective_batch,
            log=log,
            stop=stop,
            vote=distributed.StopVote(stop, device, progress.step),
        )
        metrics, stopped = run_epochs(loop, train_loader, val_loader, ckpts)
        if dist.is_main:
            summarise(cfg, progress, stopped, data_meta, time.perf_counter() - started)
        # No rank leaves before rank 0 has written: under torchrun an early exit (75 after a
        # stop) counts as a failure and gets the others killed, and gloo can abort at exit.
        distributed.barrier()
        return result(progress, metrics, stopped, model)
    finally:
        close_loader(train_loader)
        close_loader(val_loader)
        log.close()
        ckpts.unlock()


def build_data(cfg: Config, meta: dict | None = None):
    """(train set, val set, data meta, task): the task says which targets it needs from the
    data and sizes the model's output from it. `meta`: a checkpoint's, for evaluation."""
    train_set, val_set, meta = build_datasets(cfg.data, TASKS[cfg.task.name].targets, meta)
    return train_set, val_set, meta, build_task(cfg.task, source_of(train_set))


def build_net(cfg: Config, train_set, task, device: torch.device, dist: DistInfo) -> nn.Module:
    """The model of cfg.model for this data and task, on `device`: fine-tuning weights loaded,
    BatchNorm synchronised across GPUs when asked."""
    model = build_model(cfg.model, example_inputs(train_set), task.num_outputs)
    if cfg.train.init_from and not cfg.train.resume:
        skipped = checkpoint.init_from(model, cfg.train.init_from)
        if dist.is_main:
            print(f"init_from {cfg.train.init_from}: new (not loaded): {skipped or 'none'}")
    if cfg.train.sync_bn and dist.world_size > 1:
        if device.type != "cuda":  # DDP refuses SyncBatchNorm on CPU modules
            raise ConfigError("train.sync_bn=true needs CUDA GPUs; set train.sync_bn=false")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    memory_format = torch.channels_last if cfg.train.channels_last else torch.preserve_format
    return model.to(device, memory_format=memory_format)


def open_run_folder(
    cfg: Config, ckpts: RunFolder, step: int, tracker_ids: dict | None = None
) -> MetricLogger:
    """Rank 0 takes the run folder: lock, resolved config, and the logger from `step` on
    (its trackers continue the runs of `tracker_ids`, saved in the checkpoint resumed)."""
    ckpts.lock()
    ckpts.remove_stale_temporaries()
    log = MetricLogger(ckpts.run_dir, cfg.run.loggers, step, to_dict(cfg), tracker_ids)
    save_config(cfg, ckpts.run_dir / "config.yaml")
    return log


def run_epochs(loop: Loop, train_loader, val_loader, ckpts) -> tuple[dict, str | None]:
    """Train an epoch, validate, checkpoint; until the last epoch, early stopping, or a stop,
    which saves where it is (mid-epoch too). Returns the last validation metrics and the stop
    reason."""
    cfg, progress = loop.cfg, loop.progress
    metrics, (best_metric, best_mode) = {}, cfg.best()
    for epoch in range(progress.epoch, cfg.train.epochs):
        progress.epoch = epoch
        set_epoch(train_loader, epoch, start=progress.epoch_samples)
        start = time.perf_counter()
        stats, stopped = train_one_epoch(loop, train_loader)
        if stats is None:  # stopped mid-epoch: save the position inside it
            save(loop, ckpts, is_best=False)
            return metrics, stopped
        train_time = time.perf_counter() - start
        distributed.sync_buffers(loop.model)  # every rank evaluates the BatchNorm stats it saves
        metrics = evaluate(loop.model, val_loader, loop.task, loop.device, cfg.train.amp)
        progress.epoch, progress.epoch_samples = epoch + 1, 0
        is_best = progress.improves(
            metrics[best_metric], best_mode, cfg.train.early_stop_min_delta
        )
        progress.train_seconds += train_time
        progress.samples += stats["samples"]
        progress.metrics = metrics
        save(loop, ckpts, is_best)
        report_epoch(loop, stats, metrics, train_time, is_best)
        if not stopped and epoch + 1 < cfg.train.epochs:
            stopped = resume.complete_reason(cfg, progress)  # early stopping (bad_epochs)
        if stopped:
            return metrics, stopped
    return metrics, None


def summarise(
    cfg: Config, progress: Progress, stopped: str | None, meta: dict, seconds: float
) -> None:
    """Where a stopped run was saved; or a complete run's line in runs.csv and its summary."""
    if stopped not in COMPLETE:
        last = Path(cfg.run.output_dir) / cfg.run.name / "last.pt"
        print(f"stopped ({stopped}) at step {progress.step}; saved {last}")
        return
    record_run(
        Path(cfg.run.output_dir),
        {
            "run": cfg.run.name,
            "task": cfg.task.name,
            "model": cfg.model.name,
            "epochs": progress.epoch,
            "steps": progress.step,
            f"best_val_{cfg.best()[0]}": progress.best,
            **{f"val_{k}": v for k, v in progress.metrics.items()},
        },
    )
    print(summary(cfg, progress, stopped or "finished", meta, seconds))


def result(progress: Progress, metrics: dict, stopped: str | None, model: nn.Module) -> dict:
    return {
        "metrics": metrics,
        "step": progress.step,
        "epoch": progress.epoch,
        "best": progress.best,
        "stopped": stopped,
        "model": model,
    }


def train_one_epoch(loop: Loop, loader) -> tuple[dict | None, str | None]:
    """Train to the end of the epoch or until a stop is due (signal, train.max_steps).

    Returns the epoch's stats (None when it stopped before its end) and the stop reason."""
    cfg, progress, device = loop.cfg, loop.progress, loop.device
    loop.net.train()
    accum = cfg.train.grad_accum_steps
    done = progress.epoch_samples // loop.effective_batch  # steps this epoch before a resume
    steps_left = min(loop.steps_per_epoch - done, len(loader) // accum)
    batches = iter(loader)
    mixed_precision = autocast(device, cfg.train.amp)
    # Losses stay on the device, detached, until the next log: reading a value (.item(),
    # .tolist()) waits for the GPU, so it happens only every run.log_every steps; collecting
    # them launches no kernel per step.
    losses: list[torch.Tensor] = []
    params = list(loop.net.parameters())  # walked once: the module tree costs ~50 us a walk
    since_log, epoch_loss, epoch_steps, stopped = 0, 0.0, 0, None
    bar = tqdm(
        total=loop.steps_per_epoch,
        initial=done,
        leave=False,
        dynamic_ncols=True,
        disable=None if loop.dist.is_main else True,
        desc=f"epoch {progress.epoch + 1}/{cfg.train.epochs}",
    )
    finished = True  # also when a resumed epoch has nothing left to do
    for i in range(steps_left):
        for micro in range(accum):
            x, y = to_device(next(batches), device)
            if cfg.train.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            # Reduce gradients across ranks only on the last micro-step of an accumulation.
            with parallel.no_sync(loop.ddp, skip=micro < accum - 1):
                with mixed_precision:
                    loss = loop.task.loss(loop.net(x), y)
                # Divide so the accumulated gradient is the mean over the effective batch.
                loop.scaler.scale(loss / accum).backward()
            losses.append(loss.detach())
        loop.scaler.unscale_(loop.optimizer)  # clip the true gradients, not fp16-scaled ones
        grad_norm = parallel.clip_grad_norm_(params, cfg.train.grad_clip or math.inf)
        loop.scaler.step(loop.optimizer)  # skipped when fp16 gradients overflowed (no error)
        loop.scaler.update()
        loop.optimizer.zero_grad(set_to_none=True)
        loop.scheduler.step()
        progress.step += 1
        progress.epoch_samples += loop.effective_batch
        since_log += 1
        bar.update()

        last = i == steps_left - 1
        at_limit = 0 < cfg.train.max_steps <= progress.step
        log_now = progress.step % cfg.run.log_every == 0 or last or at_limit
        if not log_now and loop.vote.due(progress.step):
            # Ranks compare stop requests every couple of seconds (distributed.StopVote); a
            # stop is logged like the end of an interval.
            log_now = loop.vote(progress.step)
        if log_now:
            avg, any_stop = read_losses(loop, losses, since_log)
            epoch_loss, epoch_steps = epoch_loss + avg * since_log, epoch_steps + since_log
            losses.clear()
            since_log = 0
            lr = loop.scheduler.get_last_lr()[0]
            loop.log.scalars(
                progress.step,
                {"train/loss": avg, "train/lr": lr, "train/grad_norm": float(grad_norm)},
            )
            bar.set_postfix(loss=f"{avg:.4f}", lr=f"{lr:.2e}", refresh=False)
            if any_stop:
                stopped = loop.stop.reason or "signal on another rank"
        if at_limit:
            stopped = stopped or "max_steps"
        if stopped:
            finished = last
            break
    bar.close()
    if not finished:
        return None, stopped
    stats = {
        "loss": epoch_loss / max(epoch_steps, 1),
        "samples": epoch_steps * loop.effective_batch,
    }
    return stats, stopped


def read_losses(loop: Loop, losses: list[torch.Tensor], steps: int) -> tuple[float, bool]:
    """Mean loss over ranks of the last `steps` steps, and whether any rank was asked to stop.
    Raises NonFiniteLoss naming the first step whose loss was not finite."""
    step_losses = torch.stack(losses).view(steps, -1).mean(1)  # (steps,): one mean per step
    bad = ~torch.isfinite(step_losses)
    first = bad.float().argmax() + (loop.progress.step - steps + 1)
    first_bad = torch.where(bad.any(), first, -1).float()
    # One small collective carries everything the ranks must agree on.
    asked = torch.tensor(float(loop.stop.requested), device=loop.device)
    flags = distributed.all_reduce_max(torch.stack([first_bad, asked]))
    total = distributed.all_reduce_sum(step_losses.sum())
    bad_step, any_stop = flags.tolist()
    if bad_step >= 0:
        raise NonFiniteLoss(
            f"loss is not finite at step {int(bad_step)}; stopped, the last good checkpoint "
            "is kept (lower train.lr, use train.amp=bf16, or check the data)"
        )
    return total.item() / loop.dist.world_size / steps, bool(any_stop)


@torch.inference_mode()
def evaluate(
    model: nn.Module, loader, task, device: torch.device, amp: str = "off", observe=None
) -> dict:
    """The task's metrics over the whole split, counting each sample once on any number of
    ranks: the task's sums and counts are all-reduced, never per-rank means. `observe(output,
    y)`, if given, sees every batch (e.g. report.Collector)."""
    was_training = model.training
    model.eval()
    totals = None
    mixed_precision = autocast(device, amp)
    for batch in loader:
        x, y = to_device(batch, device)
        with mixed_precision:
            output = model(x)
        sums = task.sums(output, y)
        if observe is not None:
            observe(output, y)
        totals = sums if totals is None else totals + sums
    if totals is None:  # no sample on this rank (fewer than ranks): zeros of the right size
        x, y = to_device(loader.dataset[0], device)
        totals = task.sums(model(x[None][:0]), y[None][:0])
    distributed.all_reduce_sum(totals)
    model.train(was_training)
    return task.summarise(totals.tolist())


def save(loop: Loop, ckpts: RunFolder, is_best: bool) -> None:
    rngs = distributed.all_gather_object(rng_state())  # a collective: every rank calls it
    run_dir, step = ckpts.run_dir, loop.progress.step
    shards = parallel.save_shards(loop.model, loop.optimizer, run_dir, step)  # fsdp, every rank
    if loop.dist.is_main:
        state = checkpoint.training_state(
            loop.model,
            loop.optimizer,
            loop.scheduler,
            loop.scaler,
            loop.progress,
            to_dict(loop.cfg),
            rngs,
            loop.dist.world_size,
            shards,
        )
        state["data"], state["io"] = loop.data_meta, loop.io
        state["trackers"] = loop.log.tracker_ids()  # a resume continues the same tracker runs
        ckpts.save(state, loop.progress.step, is_best)


def report_epoch(loop: Loop, stats: dict, metrics: dict, train_time: float, is_best: bool):
    """metrics.csv + TensorBoard (rank 0's logger) and one line on the console."""
    row = {
        "epoch": loop.progress.epoch,
        "step": loop.progress.step,
        "train/epoch_loss": stats["loss"],  # train/loss is the per-step curve
        **{f"val/{k}": v for k, v in metrics.items() if k != "count"},
        "lr": loop.scheduler.get_last_lr()[0],
        "time/train_s": train_time,
        "throughput/samples_per_s": stats["samples"] / train_time,
    }
    memory_name, row[memory_name] = memory_mb(loop.device)
    loop.log.epoch(row)
    if loop.dist.is_main:
        tqdm.write(
            f"epoch {row['epoch']}/{loop.cfg.train.epochs} | train loss {stats['loss']:.4f} | "
            f"val {' '.join(f'{k} {v:.4f}' for k, v in metrics.items() if k != 'count')}"
            f"{' (best)' if is_best else ''} | lr {row['lr']:.2e} | {train_time:.1f}s | "
            f"{row['throughput/samples_per_s']:.0f} samples/s | "
            f"{memory_name.split('/')[1].removesuffix('_mb').replace('_', ' ')} "
            f"{row[memory_name]:.0f} MB"
        )
