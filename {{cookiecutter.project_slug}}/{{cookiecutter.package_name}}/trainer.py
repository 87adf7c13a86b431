"""Training: `fit(cfg)` runs the recipe in `train()`, which reads top to bottom: prepare the
process, build the data and the model, resume, run the epochs (loop.py), summarise. It is
where the config's sections meet: each component gets its own (cfg.data, cfg.model, cfg.train,
...) and the few values it needs by name; only the run's record (utils/provenance.py), the
resume's check of changed settings and the summary, which describe the whole run, see it all.

One optimizer step is loop.train_step: the micro-batch loop, autocast and the scaled backward
(loop.py, utils/device.py), the task's loss (tasks/), gradient sync and clipping
(parallel.py). README.md's "What the training loop does" maps the whole run, file by file.
It runs as one process (`python scripts/train.py`) or under torchrun, one process per GPU
(or CPU slot) with DistributedDataParallel (parallel.py).  # feature: !fsdp
(or CPU slot) with DistributedDataParallel (parallel.py), or sharded with FSDP (fsdp.py).  # feature: fsdp
"""

from __future__ import annotations

import functools  # feature: fsdp
import time
from pathlib import Path

import torch
from torch import nn

from . import checkpoint, distributed, ema, finetune, microbatch, parallel
from .checkpoint import CheckpointManager, Progress
from .config import Config, to_dict
from .data import build_datasets, build_loader, close_loader, drop_note, example_batch, source_of
from .distributed import DistInfo
from .errors import EXIT_STOPPED, ConfigError
from .fsdp import even_batches, is_sharded, memory_report, shard  # feature: fsdp
from .loop import Data, Loop, Trainee, run_epochs
from .models import architecture, build_model, model_io, preprocessing
from .optim import (
    build_optimizer,
    build_scheduler,
    continue_schedule,
    planned_steps,
    scaled_lr,
    warmup_warning,
)
from .summary import COMPLETE, finish, report_complete
from .tasks import TASKS, build_task, check_task
from .utils import provenance
from .utils.device import busy_note, check_amp, configure_backends, configure_threads
from .utils.logger import MetricLogger, human_count
from .utils.seed import mix_seed, seed_everything
from .utils.signals import StopSignal
from .utils.trackers import check_installed
from .validation import evaluate, held_out_test, score_test

__all__ = ["EXIT_PREEMPTED", "build_data", "evaluate", "fit"]

EXIT_PREEMPTED = EXIT_STOPPED  # stopped (SIGTERM/SIGUSR1/Ctrl-C) after saving; rerun to resume


def fit(cfg: Config, hooks=()) -> dict:
    """Train as `cfg` says, calling `hooks` with the loop after each step (--profile); returns
    the last metrics, where it stopped, the model. Joins torchrun's process group and leaves it."""
    stop = StopSignal()
    stop.install()  # from the start: a signal during set-up stops the run after one step
    try:
        dist, device = distributed.setup(cfg.run.device, cfg.train.cpu_offload)  # feature: fsdp
        dist, device = distributed.setup(cfg.run.device)  # feature: !fsdp
        return train(cfg, dist, device, stop, hooks)
    finally:
        # After train()'s frame is gone: no DDP (its gloo work holds Python objects) outlives
        # the group. The signal handlers stay past it: a 2nd SIGTERM then is only noted.
        distributed.teardown()
        stop.restore()


def train(cfg: Config, dist: DistInfo, device: torch.device, stop: StopSignal, hooks=()):
    """The recipe. Everything is built and checked before anything is written, so bad input
    leaves no trace; then resume (or refuse to overwrite a run), train, summarise."""
    started = time.perf_counter()
    threads = prepare_process(cfg, dist, device)
    progress = Progress()
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    ckpts = CheckpointManager(run_dir, cfg.train.keep_last, dist, to_dict(cfg))
    log = MetricLogger(None)
    data = None
    try:
        # First what to continue from: a checkpoint found wins over train.init_from (which
        # only starts a fresh run, with resume=auto too, as SLURM jobs pass it).
        state, resumed_from = ckpts.find(cfg.train.resume)
        # Then the data, read as that checkpoint's model reads it (a CSV's columns by name).
        data = build_loaders(cfg, dist, device, state)
        test_set = held_out_test(cfg.data, TASKS[cfg.task.name].targets, data)  # in data.meta
        trainee = build_trainee(cfg, data, dist, device, resumed_from)
        if state is not None:
            restore(cfg, dist, ckpts, state, data, trainee, progress)
            done = checkpoint.complete_reason(cfg.train, progress)
            if done:
                if dist.is_main:
                    report_complete(cfg, progress, done, data.meta)
                stopped = None if done == "finished" else done
                return result(progress, progress.metrics, stopped, trainee.model)
        distributed.barrier()  # every rank has checked and loaded before rank 0 writes
        distribute(cfg, dist, device, trainee, progress)
        if dist.is_main:
            log = open_run_folder(cfg, ckpts, progress.step, (state or {}).get("trackers"))
            announce(cfg, dist, device, data, trainee, threads, progress, state is not None)
        vote = distributed.StopVote(stop, device, progress.step)
        own = loop_settings(cfg, run_dir)
        loop = Loop(**own, dist=dist, device=device, data=data, trainee=trainee,
                    progress=progress, log=log, stop=stop, vote=vote, hooks=[*hooks])  # fmt: skip
        metrics, stopped = run_epochs(loop, ckpts)
        test = score_test(loop, test_set, cfg.task) if stopped in COMPLETE else None
        if dist.is_main:
            log.close()  # draws the last curves.png, which the summary lists
            finish(cfg, progress, stopped, data.meta, time.perf_counter() - started, test)
        # No rank leaves before rank 0 has written: under torchrun an early exit (75 after a
        # stop) counts as a failure and gets the others killed, and gloo can abort at exit.
        distributed.barrier()
        return result(progress, metrics, stopped, trainee.model)
    finally:
        for loader in (data.train_loader, data.val_loader) if data else ():
            close_loader(loader)
        log.close()
        ckpts.close()


def prepare_process(cfg: Config, dist: DistInfo, device: torch.device) -> int:
    """Checks that need the device, CPU threads, backend flags and seeds; returns the threads."""
    check_amp(cfg.train.amp, device)
    check_installed(cfg.run.loggers)  # a tracker's package is optional
    threads = configure_threads(cfg.run.threads)  # shared by the processes of this machine
    configure_backends(device, cfg.train.tf32, cfg.run.deterministic)
    # A hash, not seed + rank: seed 43's rank 0 would be seed 42's rank 1.
    seed_everything(mix_seed(cfg.run.seed, dist.rank), cfg.run.deterministic)
    return threads


def build_data(cfg: Config, meta: dict | None = None, like: dict | None = None):
    """(train set, val set, data meta, task): the task sizes the model's output from the data.
    `meta`: a checkpoint's (it says how to read inputs); `like`: a resumed run's."""
    targets, prep = TASKS[cfg.task.name].targets, not meta and preprocessing(cfg.model)
    train_set, val_set, meta = build_datasets(cfg.data, targets, meta, like, prep)
    return train_set, val_set, meta, build_task(cfg.task, source_of(train_set), meta, cfg.best())


def build_loaders(cfg: Config, dist: DistInfo, device: torch.device, state=None) -> Data:
    """The datasets, this rank's loaders and the task; checks the batch fits the data. The
    inputs are read as the model continued reads them: `state`'s, else train.init_from's (its
    data part: the weights are mapped, not read; under fsdp rank 0 alone loads them)."""  # feature: fsdp
    data part: the weights are mapped, not read)."""  # feature: !fsdp
    like = state or (cfg.train.init_from and checkpoint.load(cfg.train.init_from, mmap=True))
    train_set, val_set, meta, task = build_data(cfg, like=(like or {}).get("data"))
    # Each rank reads its own shard; pinned memory only helps host-to-GPU copies.
    loader_args = dict(cfg=cfg.data, seed=cfg.run.seed, rank=dist.rank, world_size=dist.world_size)
    loader_args["pin_memory"] = cfg.data.pin_memory and device.type == "cuda"
    batch = cfg.train.batch_size
    train_loader = build_loader(train_set, batch_size=batch, train=True, **loader_args)
    val_loader = build_loader(val_set, batch_size=2 * batch, train=False, **loader_args)
    # The epoch's last step takes the micro-batches left over (loop.train_one_epoch).
    steps_per_epoch = -(-len(train_loader) // cfg.train.grad_accum_steps)
    effective_batch = batch * cfg.train.grad_accum_steps * dist.world_size
    if len(train_loader) < cfg.train.grad_accum_steps:
        raise ConfigError(
            f"the effective batch ({effective_batch} = train.batch_size x "
            f"train.grad_accum_steps x {dist.world_size} ranks) exceeds the "
            f"{len(train_set)} training samples; lower train.batch_size"
        )
    example, example_y = example_batch(train_set)  # what the model is built and tried on
    if cfg.train.channels_last and example.dim() != 4:  # it would change nothing: say so
        raise ConfigError(
            f"train.channels_last=true is a layout of image batches (N, C, H, W), but "
            f"data.name={cfg.data.name} gives inputs of shape {tuple(example.shape)}; set "
            "train.channels_last=false"
        )
    return Data(
        train_set=train_set,
        val_set=val_set,
        train_loader=train_loader,
        val_loader=val_loader,
        task=task,
        meta=meta,
        example=example,
        example_y=example_y,
        io=model_io(example, task.num_outputs, source_of(train_set)),
        steps_per_epoch=steps_per_epoch,
        effective_batch=effective_batch,
        loader_args=loader_args,
    )


def build_net(
    cfg: Config, data: Data, device: torch.device, dist: DistInfo, resumed_from: str | None
) -> nn.Module:
    """The model of cfg.model for this data and task, on `device` as train.strategy holds it,
    with fine-tuning weights unless the run resumes from `resumed_from`."""
    example, task = data.example, data.task
    shape = (example, task.num_outputs)

    def full() -> nn.Module:  # on the CPU, tried with the task on a batch (tasks/protocol.py)
        # A resumed run's weights are in its checkpoint: pretrained ones are not read again.
        model = build_model(architecture(cfg.model) if resumed_from else cfg.model, *shape)
        check_task(task, model, example, data.example_y)
        if dist.is_main and getattr(model, "weights_note", None) and not resumed_from:
            print(model.weights_note)  # a pretrained model's tensors: loaded, and new
        if cfg.train.init_from and resumed_from:
            if dist.is_main:  # the run's own checkpoint holds the weights to continue
                print(f"train.init_from is not used: the run resumes from {resumed_from}")
        elif cfg.train.init_from:
            skipped = checkpoint.init_from(model, cfg.train.init_from)
            if dist.is_main:
                print(f"init_from {cfg.train.init_from}: new (not loaded): {skipped or 'none'}")
        return model

    # >>> fsdp
    if cfg.train.strategy == "fsdp":  # rank 0 builds it in host memory; each rank its shards
        layout = functools.partial(
            build_model, architecture(cfg.model), example.to("meta"), task.num_outputs
        )
        return shard(layout, full, cfg.train, device)
    # <<< fsdp
    return parallel.replica(full(), cfg.train, device, dist.world_size)


def build_trainee(
    cfg: Config, data: Data, dist: DistInfo, device: torch.device, resumed_from: str | None
) -> Trainee:
    """The model on its device (init_from's weights loaded before), AdamW, the warm-up +
    cosine schedule (optim.py), the fp16 loss scaler and the weights' average (ema.py)."""
    model = build_net(cfg, data, device, dist, resumed_from)
    data.val_loader = even_batches(data.val_loader, model, device)  # feature: fsdp
    lr = scaled_lr(cfg.train, data.effective_batch)
    fused = device.type in ("cuda", "cpu")
    optimizer = build_optimizer(model, cfg.train, lr, fused, cfg.model.name)
    total_steps = planned_steps(cfg.train, data.steps_per_epoch)
    scheduler = build_scheduler(optimizer, cfg.train, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
    return Trainee(model, optimizer, scheduler, scaler, lr, ema.build(model, cfg.train.ema_decay))


def restore(cfg, dist, ckpts: CheckpointManager, state, data: Data, trainee: Trainee, progress):
    """Continue the run of `state` exactly: the same data split, every state restored, the
    schedule continued; settings changed since are listed (some are refused)."""
    changed = checkpoint.changes(state, cfg, None if ckpts.new_run else ckpts.resumed_from)
    ckpts.restore(state, trainee, progress, data, cfg.train, cfg.model.name)
    total_steps = planned_steps(cfg.train, data.steps_per_epoch)
    t = trainee
    note = continue_schedule(t.optimizer, t.scheduler, cfg.train, t.lr, total_steps)
    if dist.is_main and note:
        print(note)
    if dist.is_main and changed:
        print(f"settings changed since step {progress.step}: {', '.join(changed)}")


def distribute(cfg: Config, dist: DistInfo, device: torch.device, trainee: Trainee, progress):
    """What the forward pass calls: the backbone frozen or not for the epoch (finetune.py),
    the model in DistributedDataParallel on several ranks, compiled when train.compile; and
    the micro-batch it takes (microbatch.py: a resumed run's, or train.micro_batch_size)."""
    finetune.set_epoch(trainee.model, cfg.train, progress.epoch, cfg.model.name)
    trainee.ddp, trainee.net = parallel.wrap(trainee.model, cfg.train, dist.world_size, device)
    progress.micro_batch = microbatch.in_force(cfg.train, progress.micro_batch)


def loop_settings(cfg: Config, run_dir: Path) -> dict:
    """What the loop reads of the config: its section, and what the others tell it."""
    return dict(train=cfg.train, log_every=cfg.run.log_every, model_name=cfg.model.name,
                best=cfg.best(), tie=cfg.tie_break(), run_dir=run_dir)  # fmt: skip


def announce(cfg, dist, device, data: Data, trainee: Trainee, threads: int, progress, resumed):
    """The run's one line: model size, devices, threads, precision, batch, lr, steps and the
    schedule's plan; a warning when train.warmup_steps outlasts the run."""
    params = sum(p.numel() for p in trainee.model.parameters())
    plan = trainee.scheduler.lr_lambdas[0]  # optim.WarmupCosine: a resumed run's own plan too
    print(
        f"run {cfg.run.name}: {cfg.model.name} {human_count(params)} params | {device} x "
        f"{dist.world_size} | CPU threads {threads}{busy_note(threads)} | amp {cfg.train.amp} | "
        f"effective batch {data.effective_batch}{microbatch.note(cfg.train, progress)} | "
        f"lr {trainee.lr:.2e} | {data.steps_per_epoch} steps/epoch | "
        f"warm-up {plan.warmup} of {plan.total} steps"
        + (f" | resumed at step {progress.step}" if resumed else "")
        + drop_note(data.train_set, data.train_loader, cfg.train.batch_size, dist.world_size)
    )
    if not resumed and (warning := warmup_warning(cfg.train, plan.total)):
        print(warning)
    # >>> fsdp
    if is_sharded(trainee.model):
        print(memory_report(trainee.model))
    # <<< fsdp


def open_run_folder(
    cfg: Config, ckpts: CheckpointManager, step: int, tracker_ids: dict | None = None
) -> MetricLogger:
    """Rank 0 takes the run folder: lock, config, run.json, the logger from `step` on (its
    trackers continue the runs of `tracker_ids`, saved in the checkpoint resumed)."""
    ckpts.open()
    settings = ckpts.settings
    log = MetricLogger(ckpts.run_dir, cfg.run.loggers, step, settings, tracker_ids, ckpts.lost)
    ckpts.write_config(*provenance.collect(cfg, settings, ckpts.dist.world_size))
    return log


def result(progress: Progress, metrics: dict, stopped: str | None, model: nn.Module) -> dict:
    where = {"step": progress.step, "epoch": progress.epoch, "best": progress.best}
    return {"metrics": metrics, **where, "stopped": stopped, "model": model}
