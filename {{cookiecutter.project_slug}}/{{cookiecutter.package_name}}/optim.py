"""Optimizer, learning-rate schedule and the batch-size scaling rule (seed §5.4)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig


def scaled_lr(cfg: TrainConfig, effective_batch: int) -> float:
    """Scale the learning rate with the batch: linear (SGD-like) or sqrt (Adam-like)."""
    ratio = effective_batch / cfg.ref_batch_size
    return cfg.lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]


def build_optimizer(model: nn.Module, cfg: TrainConfig, lr: float, fused: bool):
    """AdamW; `fused` runs one kernel for all parameters (CUDA and CPU), ~4x faster than the
    per-tensor loop."""
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
