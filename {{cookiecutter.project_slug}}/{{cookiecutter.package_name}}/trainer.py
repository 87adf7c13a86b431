"""The training loop. `fit(cfg)` reads top to bottom: setup, data, model, optimizer, resume,
loop (train an epoch, validate, checkpoint), summary.

The same code runs as one process (`python scripts/train.py`) and under torchrun, one process
per GPU (or CPU slot) with DistributedDataParallel; see README.md for the launch commands.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from . import checkpoint, distributed
from .config import Config, TrainConfig, save_config, to_dict
from .data import build_dataset, build_loader
from .errors import ConfigError, UserError
from .models import build_model
from .utils.device import AMP_DTYPES, check_amp, configure_backends, peak_memory_mb, to_device
from .utils.logger import MetricLogger, append_run_summary
from .utils.seed import rng_state, seed_everything, set_rng_state

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after saving; run again to resume


class NonFiniteLoss(UserError):
    pass


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    epoch: int = 0  # the epoch in progress (or the next to start)
    step: int = 0  # optimizer steps taken in total
    epoch_samples: int = 0  # samples of this epoch's (global) order already trained on
    best: float | None = None  # best validation value of train.best_metric so far


def fit(cfg: Config) -> dict:
    """Train as `cfg` says; returns the last validation metrics, where the run stopped and
    the trained model."""
    dist, device = distributed.setup(cfg.run.device)
    log = MetricLogger(None)
    stop = StopSignal()
    try:
        # Everything is built and checked before anything is written: bad input leaves no trace.
        check_amp(cfg.train.amp, device)
        configure_backends(device, cfg.train.tf32, cfg.run.deterministic)
        seed_everything(cfg.run.seed + dist.rank, cfg.run.deterministic)

        # Data: each rank reads its own shard; pinned memory only helps host-to-GPU copies.
        train_set, val_set = build_dataset(cfg.data, "train"), build_dataset(cfg.data, "val")
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

        # Model
        model = build_model(cfg.model, train_set.input_shape, train_set.num_classes)
        if cfg.train.init_from:
            skipped = checkpoint.init_from(model, cfg.train.init_from)
            if dist.is_main:
                print(f"init_from {cfg.train.init_from}: new (not loaded): {skipped or 'none'}")
        if cfg.train.sync_bn and dist.world_size > 1:
            if device.type != "cuda":  # DDP refuses SyncBatchNorm on CPU modules
                raise ConfigError("train.sync_bn=true needs CUDA GPUs; set train.sync_bn=false")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        memory_format = torch.channels_last if cfg.train.channels_last else torch.preserve_format
        model.to(device, memory_format=memory_format)

        # Optimizer and schedule: per-step warm-up then cosine, from torch.optim.lr_scheduler.
        lr = scaled_lr(cfg.train, effective_batch)
        # Fused AdamW (one kernel for all parameters) is ~4x faster than the default per-tensor
        # loop on CPU too; other devices keep torch's default.
        fused = device.type in ("cuda", "cpu")
        optimizer = build_optimizer(model, cfg.train, lr, fused=fused)
        scheduler = build_scheduler(optimizer, cfg.train, steps_per_epoch * cfg.train.epochs)
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
        progress = Progress()

        # Resume: continue this run exactly, or refuse to overwrite a run that exists.
        run_dir = Path(cfg.run.output_dir) / cfg.run.name
        ckpts = checkpoint.CheckpointManager(run_dir, cfg.train.keep_last)
        state = find_resume_state(cfg, ckpts, device, dist.is_main)
        if state is not None:
            restore(state, model, optimizer, scheduler, scaler, progress, dist.rank)
            if dist.is_main:
                note_batch_change(state, effective_batch)
        distributed.barrier()  # every rank has checked and loaded before rank 0 writes

        ddp = (
            DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
            if dist.world_size > 1
            else model
        )
        net = torch.compile(ddp) if cfg.train.compile else ddp

        if dist.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            ckpts.remove_stale_temporaries()
            save_config(cfg, run_dir / "config.yaml")
            log = MetricLogger(run_dir, cfg.run.tensorboard, start_step=progress.step)
            params = sum(p.numel() for p in model.parameters())
            print(
                f"run {cfg.run.name}: {cfg.model.name} {params / 1e6:.2f}M params | {device} x "
                f"{dist.world_size} | amp {cfg.train.amp} | effective batch {effective_batch} | "
                f"lr {lr:.2e} | {steps_per_epoch} steps/epoch"
                + (f" | resumed at step {progress.step}" if state else "")
            )

        stop.install()
        metrics: dict = {}
        stopped, finished = None, True
        for epoch in range(progress.epoch, cfg.train.epochs):
            progress.epoch = epoch
            train_loader.sampler.set_epoch(epoch, start=progress.epoch_samples)
            start = time.perf_counter()
            train_stats, stopped, finished = train_one_epoch(
                net,
                ddp,
                train_loader,
                optimizer,
                scheduler,
                scaler,
                progress,
                cfg,
                device,
                steps_per_epoch,
                effective_batch,
                stop,
                log,
                dist.is_main,
            )
            if not finished:
                break  # mid-epoch stop: saved below with the position inside the epoch
            train_time = time.perf_counter() - start
            distributed.sync_buffers(model)  # every rank evaluates the BatchNorm stats it saves
            metrics = evaluate(model, val_loader, device, cfg.train.amp)
            progress.epoch, progress.epoch_samples = epoch + 1, 0
            value = metrics[cfg.train.best_metric]
            is_best = progress.best is None or (
                value > progress.best if cfg.train.best_mode == "max" else value < progress.best
            )
            if is_best:
                progress.best = value
            save(ckpts, model, optimizer, scheduler, scaler, progress, cfg, dist, is_best)
            row = {
                "epoch": epoch + 1,
                "step": progress.step,
                "train/loss": train_stats["loss"],
                "val/loss": metrics["loss"],
                "val/acc": metrics["acc"],
                "lr": scheduler.get_last_lr()[0],
                "time/train_s": train_time,
                "throughput/samples_per_s": train_stats["samples"] / train_time,
                "memory/peak_mb": peak_memory_mb(device),
            }
            log.epoch(row)
            if dist.is_main:
                tqdm.write(
                    f"epoch {epoch + 1}/{cfg.train.epochs} | train loss {row['train/loss']:.4f} | "
                    f"val loss {metrics['loss']:.4f} acc {metrics['acc']:.4f}"
                    f"{' (best)' if is_best else ''} | lr {row['lr']:.2e} | {train_time:.1f}s | "
                    f"{row['throughput/samples_per_s']:.0f} samples/s | "
                    f"peak mem {row['memory/peak_mb']:.0f} MB"
                )
            if stopped:
                break
        if stopped and not finished:
            save(ckpts, model, optimizer, scheduler, scaler, progress, cfg, dist, is_best=False)
            if dist.is_main:
                print(f"stopped ({stopped}) at step {progress.step}; saved {run_dir / 'last.pt'}")
        elif dist.is_main:
            append_run_summary(
                Path(cfg.run.output_dir),
                {
                    "run": cfg.run.name,
                    "model": cfg.model.name,
                    "epochs": progress.epoch,
                    "steps": progress.step,
                    f"best_val_{cfg.train.best_metric}": progress.best,
                    **{f"val_{k}": v for k, v in metrics.items()},
                },
            )
        # No rank leaves before rank 0 has written: under torchrun an early exit (75 after a
        # stop) counts as a failure and gets the others killed, and gloo can abort at exit.
        distributed.barrier()
        return {
            "metrics": metrics,
            "step": progress.step,
            "epoch": progress.epoch,
            "best": progress.best,
            "stopped": stopped,
            "model": model,  # the trained plain module (this rank's copy)
        }
    finally:
        stop.restore()
        log.close()
        distributed.teardown()


def train_one_epoch(
    net,
    ddp,
    loader,
    optimizer,
    scheduler,
    scaler,
    progress: Progress,
    cfg: Config,
    device,
    steps_per_epoch: int,
    effective_batch: int,
    stop: StopSignal,
    log: MetricLogger,
    is_main: bool,
):
    """Train to the end of the epoch or until a stop is due (signal, train.max_steps).

    Returns (stats, stop reason or None, whether the epoch ran to its end)."""
    net.train()
    accum = cfg.train.grad_accum_steps
    done = progress.epoch_samples // effective_batch  # steps already taken this epoch (resume)
    steps_left = min(steps_per_epoch - done, len(loader) // accum)
    batches = iter(loader)
    amp = cfg.train.amp
    autocast = torch.autocast(device.type, AMP_DTYPES.get(amp), enabled=amp != "off")
    # Losses stay on the device, detached, until the next log: reading a value (.item(),
    # .tolist()) waits for the GPU, so it happens only every run.log_every steps; collecting
    # them launches no kernel per step.
    losses: list[torch.Tensor] = []
    params = list(net.parameters())  # walked once: the module tree costs ~50 us per walk
    since_log, epoch_loss, epoch_steps, stopped = 0, 0.0, 0, None
    bar = tqdm(
        total=steps_per_epoch,
        initial=done,
        disable=None if is_main else True,
        desc=f"epoch {progress.epoch + 1}/{cfg.train.epochs}",
        leave=False,
        dynamic_ncols=True,
    )
    i = steps_left - 1  # a resumed epoch may have nothing left to do
    for i in range(steps_left):
        for micro in range(accum):
            x, y = to_device(next(batches), device)
            if cfg.train.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            # Under DDP, all-reduce gradients only on the last micro-step of an accumulation.
            skip_sync = micro < accum - 1 and isinstance(ddp, DistributedDataParallel)
            with ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with autocast:
                    loss = F.cross_entropy(net(x), y)
                # Divide so the accumulated gradient is the mean over the effective batch.
                scaler.scale(loss / accum).backward()
            losses.append(loss.detach())
        scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
        grad_norm = nn.utils.clip_grad_norm_(params, cfg.train.grad_clip or math.inf)
        scaler.step(optimizer)  # skipped when fp16 gradients overflowed (not an error)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        progress.step += 1
        progress.epoch_samples += effective_batch
        since_log += 1
        bar.update()

        last = i == steps_left - 1
        at_limit = 0 < cfg.train.max_steps <= progress.step
        # Every rank must reach the collective below at the same step, so a signal (seen by
        # one rank first) only cuts the interval short in a single process.
        local_stop = stop.requested and not distributed.is_distributed()
        if progress.step % cfg.run.log_every == 0 or last or at_limit or local_stop:
            # Each step's mean loss since the last log, and the first step that was not finite.
            step_losses = torch.stack(losses).view(since_log, accum).mean(1)
            bad = ~torch.isfinite(step_losses)
            first = bad.float().argmax() + (progress.step - since_log + 1)
            first_bad = torch.where(bad.any(), first, -1).float()
            # One small collective carries everything the ranks must agree on.
            asked = torch.tensor(float(stop.requested), device=device)
            flags = distributed.all_reduce_max(torch.stack([first_bad, asked]))
            total = distributed.all_reduce_sum(step_losses.sum())
            bad_step, any_stop = flags.tolist()
            if bad_step >= 0:
                raise NonFiniteLoss(
                    f"loss is not finite at step {int(bad_step)}; stopped, the last good "
                    "checkpoint is kept (lower train.lr, use train.amp=bf16, or check the data)"
                )
            avg = total.item() / distributed_world() / since_log
            epoch_loss, epoch_steps = epoch_loss + avg * since_log, epoch_steps + since_log
            losses.clear()
            since_log = 0
            lr = scheduler.get_last_lr()[0]
            log.scalars(
                progress.step,
                {"train/loss": avg, "train/lr": lr, "train/grad_norm": float(grad_norm)},
            )
            bar.set_postfix(loss=f"{avg:.4f}", lr=f"{lr:.2e}", refresh=False)
            if any_stop:
                stopped = stop.reason or "signal on another rank"
        if at_limit:
            stopped = stopped or "max_steps"
        if stopped:
            break
    bar.close()
    stats = {"loss": epoch_loss / max(epoch_steps, 1), "samples": epoch_steps * effective_batch}
    return stats, stopped, i == steps_left - 1


@torch.inference_mode()
def evaluate(model: nn.Module, loader, device: torch.device, amp: str = "off") -> dict:
    """Mean loss and accuracy over the whole split, counting each sample once on any number
    of ranks: sums and counts are all-reduced, never per-rank means."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, device=device)  # loss sum, correct, count
    autocast = torch.autocast(device.type, AMP_DTYPES.get(amp), enabled=amp != "off")
    for batch in loader:
        x, y = to_device(batch, device)
        with autocast:
            logits = model(x)
        totals[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        totals[1] += (logits.argmax(1) == y).sum()
        totals[2] += len(y)
    distributed.all_reduce_sum(totals)
    model.train(was_training)
    loss, correct, count = totals.tolist()
    return {"loss": loss / count, "acc": correct / count, "count": int(count)}


def scaled_lr(cfg: TrainConfig, effective_batch: int) -> float:
    """The seed's rule: scale the learning rate with the batch (linear, or sqrt for Adam-like)."""
    ratio = effective_batch / cfg.ref_batch_size
    return cfg.lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float, fused: bool):
    # No weight decay on biases and norm weights (1-D tensors): decaying them only hurts.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, fused=fused or None)


def build_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    """Linear warm-up, then cosine decay to lr * min_lr_ratio, as a LambdaLR of the step.

    A pure function of the step (rather than chained LinearLR/CosineAnnealingLR, whose state
    carries the old plan and whose cosine climbs again past T_max) means a resumed run follows
    the *current* train.epochs: extending a finished run continues at the floor lr, and the
    same config resumes to the same lr bit for bit."""
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)

    def factor(step: int) -> float:  # multiplier of the peak lr after `step` optimizer steps
        if step < warmup:
            return (step + 1) / (warmup + 1)
        done = min((step - warmup) / decay_steps, 1.0)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def find_resume_state(cfg: Config, ckpts, device, is_main: bool) -> dict | None:
    resume = cfg.train.resume
    if resume == "auto":
        found = ckpts.latest(
            map_location=device, warn=print if is_main else _quiet, quarantine=is_main
        )
        if found is None:
            if is_main:
                print(f"train.resume=auto: no checkpoint in {ckpts.run_dir}, starting fresh")
            return None
        return found[0]
    if resume:
        return checkpoint.load(resume, map_location=device)
    if (ckpts.run_dir / "config.yaml").exists() or ckpts.step_files():
        raise ConfigError(
            f"run {cfg.run.name!r} already exists in {ckpts.run_dir}; continue it with "
            "train.resume=auto, or start a new one with run.name=<new name>"
        )
    return None


def restore(state: dict, model, optimizer, scheduler, scaler, progress: Progress, rank: int):
    checkpoint.load_model_state(model, state["model"], "resume")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    for key, value in state["progress"].items():
        setattr(progress, key, value)
    rngs = state.get("rng", [])
    # Exact continuation needs this rank's own RNG streams; on another world size the ranks
    # keep their fresh seeds (the data order still resumes exactly, see data/sampler.py).
    if len(rngs) == distributed_world():
        set_rng_state(rngs[rank])


def note_batch_change(state: dict, effective_batch: int) -> None:
    """Resuming on another number of ranks continues exactly when the effective batch stays."""
    train, ranks = state["config"]["train"], state["meta"]["world_size"]
    saved = train["batch_size"] * train["grad_accum_steps"] * ranks
    if saved != effective_batch:
        print(
            f"note: the checkpoint's effective batch was {saved} ({ranks} ranks), now "
            f"{effective_batch}: the data resumes at the same sample, the lr schedule continues "
            f"as planned for {saved}; keep train.batch_size x train.grad_accum_steps x ranks = "
            f"{saved} to continue exactly"
        )


def save(ckpts, model, optimizer, scheduler, scaler, progress, cfg, dist, is_best: bool):
    rngs = distributed.all_gather_object(rng_state())  # a collective: every rank calls it
    if not dist.is_main:
        return
    state = {
        "model": model.state_dict(),  # the plain module: no module./_orig_mod. prefixes
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "progress": asdict(progress),
        "rng": rngs,
        "config": to_dict(cfg),
        "meta": {
            "torch": str(torch.__version__),
            "git_commit": _git_commit(),
            "world_size": dist.world_size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    }
    ckpts.save(state, progress.step, is_best)


class StopSignal:
    """SIGTERM / SIGUSR1 (what SLURM and cloud schedulers send before preempting) only set a
    flag; the loop finishes its step, saves a checkpoint and exits with EXIT_PREEMPTED."""

    SIGNALS = tuple(
        getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name)
    )

    def __init__(self):
        self.reason: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.reason = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def distributed_world() -> int:
    return torch.distributed.get_world_size() if distributed.is_distributed() else 1


@functools.cache  # once per run: the code that runs is the code at start, and git costs ~5 ms
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _quiet(*args) -> None:
    pass
