"""Optimizer, learning-rate schedule and the batch-size scaling rule."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig
from .finetune import param_groups


def scaled_lr(cfg: TrainConfig, effective_batch: int) -> float:
    """Scale the learning rate with the batch: linear (SGD-like) or sqrt (Adam-like)."""
    ratio = effective_batch / cfg.ref_batch_size
    return cfg.lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, lr: float, fused: bool, model_name: str = "this model"
):
    """AdamW; `fused` runs one kernel for all parameters (CUDA and CPU), ~4x faster than the
    per-tensor loop. No weight decay on biases and norm weights (1-D tensors): decaying them
    only hurts. A fine-tuned backbone's groups run at train.backbone_lr_ratio x lr."""
    groups = param_groups(model, cfg, model_name)
    for group in groups:
        group["lr"] = lr * group["lr_ratio"]
    return torch.optim.AdamW(groups, lr=lr, fused=fused or None)


def planned_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """The optimizer steps the run plans, which the warm-up + cosine spans: all its epochs, or
    train.max_steps where that ends it sooner (as nanoGPT and torchtitan size the schedule by
    the step budget: a run cut short by max_steps ends at the floor lr, not mid-cosine)."""
    total = steps_per_epoch * cfg.epochs
    return min(total, cfg.max_steps) if cfg.max_steps > 0 else total


def warmup_count(cfg: TrainConfig, total_steps: int) -> int:
    """train.warmup_steps in steps: a count as given, a fraction (below 1) of `total_steps`."""
    value = cfg.warmup_steps
    return round(value * total_steps) if value < 1 else int(value)


def warmup_warning(cfg: TrainConfig, total_steps: int) -> str | None:
    """A warning line when a warm-up count outlasts the run: the lr would climb all run."""
    if not warmup_count(cfg, total_steps) >= total_steps > 0:
        return None
    return (
        f"warning: train.warmup_steps={cfg.warmup_steps:g} is longer than the {total_steps} "
        "steps this run plans: the lr climbs all run; set train.warmup_steps to fewer steps, "
        "or to a fraction (0.05 = the first 5%)"
    )


def build_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    """Linear warm-up, then cosine decay to lr * min_lr_ratio at `total_steps`: a LambdaLR of
    the step, rather than chained LinearLR/CosineAnnealingLR (whose cosine climbs again past
    T_max when a run is extended)."""
    warmup = min(warmup_count(cfg, total_steps), max(total_steps - 1, 0))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(warmup, total_steps, cfg.min_lr_ratio)
    )


class WarmupCosine:
    """The lr multiplier after `step` optimizer steps: (step + 1) / (warmup + 1) during the
    warm-up, then a half cosine from `peak` at step `start` down to `floor` at step `total`,
    and `floor` after it. A fresh plan has start = warmup and peak = 1.

    Its fields are saved with the scheduler (LambdaLR keeps a callable object's __dict__), so
    a resumed run knows the plan it was on; `replan` bends that plan to new settings."""

    def __init__(self, warmup: int, total: int, floor: float):
        self.warmup, self.total, self.floor = warmup, total, floor
        self.start, self.peak = warmup, 1.0

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        done = min((step - self.start) / max(self.total - self.start, 1), 1.0)
        return self.floor + (self.peak - self.floor) * 0.5 * (1 + math.cos(math.pi * done))

    def replan(self, step: int, total: int, floor: float) -> None:
        """New length or floor from `step` on, without a jump: the cosine restarts from the
        current multiplier and ends at `floor` at `total`. A finished run that is extended
        stays at its floor; during the warm-up only the decay after it changes."""
        if step > self.warmup:
            self.start, self.peak = step, self(step)
        self.total, self.floor = total, floor


def continue_schedule(
    optimizer, scheduler, cfg: TrainConfig, lr: float, total_steps: int
) -> str | None:
    """After loading a checkpoint: apply the current settings from the resumed step on.
    Returns a note when a run whose schedule had ended is extended (its lr stays at the floor).

    load_state_dict brings back the old peak lr (base_lrs), weight decay and plan; without
    this, a changed train.lr or train.epochs would be recorded but not used, and the first
    step would run at the old plan's lr."""
    plan = scheduler.lr_lambdas[0]  # the WarmupCosine of build_scheduler, with its saved fields
    step = scheduler.last_epoch
    ended = plan.total if plan.total <= step < total_steps else None  # extended past its end
    if (plan.total, plan.floor) != (total_steps, cfg.min_lr_ratio):
        plan.replan(step, total_steps, cfg.min_lr_ratio)
    for i, group in enumerate(optimizer.param_groups):
        # A backbone's groups keep their ratio of the peak lr (finetune.py), changed or not.
        if group.get("part") == "backbone":
            group["lr_ratio"] = cfg.backbone_lr_ratio
        group["initial_lr"] = lr * group.get("lr_ratio", 1.0)
        group["lr"] = group["initial_lr"] * plan(step)
        if group.get("decay", i == 0):  # the decayed groups, see build_optimizer
            group["weight_decay"] = cfg.weight_decay
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    if ended is None:
        return None
    return (
        f"note: the lr schedule of this run ended at step {ended}; its {total_steps - step} more "
        f"steps train at the floor lr {scheduler._last_lr[0]:.2e} (train.lr x "
        "train.min_lr_ratio), no new warm-up or decay; for those, start a new run from its "
        "weights with train.init_from=<its checkpoint>"
    )
