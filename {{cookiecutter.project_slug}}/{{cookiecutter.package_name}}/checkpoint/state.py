"""The training state in a checkpoint: where the run stands (Progress), the state built from
the objects being trained and restored into them, and model weights loaded strictly (resume)
or where they fit (train.init_from).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..errors import CheckpointError
from ..utils import provenance
from ..utils.seed import set_rng_state
from .files import load, model_weights

PREFIXES = ("module.", "_orig_mod.")  # added by DistributedDataParallel and torch.compile


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    epoch: int = 0  # the epoch in progress (or the next to start)
    step: int = 0  # optimizer steps taken in total
    epoch_samples: int = 0  # samples of this epoch's (global) order already trained on
    best: float | None = None  # best validation value of train.best_metric so far
    # Fields added later keep their defaults when an older checkpoint is restored.
    best_epoch: int | None = None  # the epoch (1-based) whose validation gave `best`
    bad_epochs: int = 0  # epochs since `best` last improved by more than early_stop_min_delta
    best_tie: float | None = None  # the tie-break metric (Config.tie_break) at `best`
    train_seconds: float = 0.0  # time in completed training epochs (no validation), all sessions
    samples: int = 0  # samples trained on in those epochs: with train_seconds, the throughput
    metrics: dict = field(default_factory=dict)  # the last validation metrics
    skipped: int = 0  # steps dropped as not finite (train.on_nonfinite=skip), all sessions
    skipped_in_a_row: int = 0  # of them, the last ones in a row (train.max_skipped stops)
    micro_batch: int = 0  # train.micro_batch_size in force (microbatch.py); 0 = whole batches

    def improves(
        self,
        value: float,
        mode: str,
        min_delta: float = 0.0,
        epoch_end: bool = True,
        tie: tuple[float, str] | None = None,
    ) -> bool:
        """Record the validation `value` of the epoch just finished (self.epoch of them): the
        best if it is (True then), and whether it improved on the best by more than
        `min_delta`, which early stopping counts in bad_epochs. Not `epoch_end`: a validation
        inside epoch self.epoch + 1 (train.max_steps), which early stopping does not count.
        `tie`: (value, mode) of the metric that decides between equal values (small
        validation sets tie often): the later model wins only if it is better there."""
        sign = 1.0 if mode == "max" else -1.0
        if epoch_end:
            significant = self.best is None or sign * (value - self.best) > min_delta
            self.bad_epochs = 0 if significant else self.bad_epochs + 1
        better = self.best is None or sign * (value - self.best) > 0
        if value == self.best and tie is not None and self.best_tie is not None:
            better = (1.0 if tie[1] == "max" else -1.0) * (tie[0] - self.best_tie) > 0
        if better:
            self.best, self.best_epoch = value, self.epoch + (0 if epoch_end else 1)
            self.best_tie = tie[0] if tie is not None else None
        return better


def training_state(
    model,
    optimizer,
    scheduler,
    scaler,
    progress: Progress,
    config: dict,
    rngs: list,
    world_size: int,
    shards: str | None = None,  # feature: fsdp
) -> dict:
    """Everything needed to continue as if never stopped (tensors and plain containers only).  # feature: fsdp
    With `shards` (train.strategy=fsdp) the model and optimizer are in that folder instead."""  # feature: fsdp
    """Everything needed to continue as if never stopped (tensors and plain containers only)."""  # feature: !fsdp
    # The plain module's state_dict: no module./_orig_mod. prefixes.
    # >>> fsdp
    if shards:  # the folder's name, not its contents (the run folder can move)
        weights = {"shards": shards}
    else:
        weights = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    # <<< fsdp
    # >>> !fsdp
    weights = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    # <<< !fsdp
    return {
        **weights,
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "progress": asdict(progress),
        "rng": rngs,  # one entry per rank
        "config": config,
        "meta": {
            "torch": str(torch.__version__),
            "git_commit": provenance.git_commit(),
            "world_size": world_size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    }


def restore_training_state(
    state: dict,
    model,
    optimizer,
    scheduler,
    scaler,
    progress: Progress,
    rank: int,
    world_size: int,
) -> None:
    """Load a training state (read on the CPU) into objects on the training device:
    load_state_dict copies each tensor to where its parameter lives."""
    if "model" in state:  # a sharded state has none: sharded.restore loaded its shards  # feature: fsdp
    if "model" in state:  # feature: !fsdp
        load_model_state(model, state["model"], "resume")
        optimizer.load_state_dict(state["optimizer"])
    match_layouts(optimizer)
    scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:  # empty when saved without fp16; a fresh scaler starts from defaults
        scaler.load_state_dict(state["scaler"])
    for key, value in state["progress"].items():
        setattr(progress, key, value)
    rngs = state.get("rng", [])
    # Exact continuation needs this rank's own RNG streams; on another world size the ranks
    # keep their fresh seeds (the data order still resumes exactly, see data/sampler.py).
    if len(rngs) == world_size:
        set_rng_state(rngs[rank])


def match_layouts(optimizer) -> None:
    """Give each state tensor its parameter's memory layout. load_state_dict casts dtype and
    device, not layout: resumed with train.channels_last changed, the moments would keep the
    old one, and the fused AdamW step pairs elements by memory offset (wrong updates on the
    CPU, an error on CUDA)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape == param.shape
                    and value.stride() != param.stride()
                ):
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def note_batch_change(state: dict, effective_batch: int) -> None:
    """Resuming on another number of ranks continues exactly when the effective batch stays."""
    train, ranks = state["config"].get("train", {}), state.get("meta", {}).get("world_size", 1)
    saved = train.get("batch_size", 0) * train.get("grad_accum_steps", 1) * ranks
    if saved and saved != effective_batch:
        print(
            f"note: the checkpoint's effective batch was {saved} ({ranks} ranks), now "
            f"{effective_batch}: the data resumes at the same sample, the lr schedule at the "
            f"same step; keep train.batch_size x train.grad_accum_steps x ranks = {saved} to "
            "continue exactly"
        )


def strip_prefixes(state_dict: dict) -> dict:
    out = {}
    for key, value in state_dict.items():
        while key.startswith(PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def load_model_state(model: nn.Module, state_dict: dict, source: str) -> None:
    """Strict load whose error names every mismatch on one line."""
    state_dict = strip_prefixes(state_dict)
    problems = _mismatches(model.state_dict(), state_dict)
    if problems:
        raise CheckpointError(
            f"checkpoint {source!r} does not fit this model: {problems}; use the model.* and "
            "data.* settings it was trained with, or train.init_from to reuse what fits"
        )
    model.load_state_dict(state_dict)


def init_from(model: nn.Module, path: str) -> list[str]:
    """Fine-tuning start: copy every tensor whose name and shape match; return those skipped.
    Takes a training checkpoint or a bare state_dict file."""
    weights = strip_prefixes(model_weights(load(path), path))
    own = model.state_dict()
    fits = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    if not fits:
        raise CheckpointError(
            f"train.init_from={path!r}: no tensor fits this model ({_mismatches(own, weights)})"
        )
    refuse_nonfinite(fits, f"train.init_from={path!r}")
    model.load_state_dict(fits, strict=False)
    return sorted(set(own) - set(fits))


def refuse_nonfinite(weights: dict, source: str) -> None:
    """One line naming the first floating tensor of `weights` holding nan or inf: a model
    started from it computes nan, first seen deep inside a loss or a metric."""
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(
                f"{source}: tensor {name!r} holds nan or inf values; the file is damaged or "
                "was saved from a run that diverged: use another file"
            )


def _mismatches(own: dict, theirs: dict) -> str:
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    shapes = [
        f"{k} {tuple(theirs[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in theirs and tuple(theirs[k].shape) != tuple(own[k].shape)
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            more = f" and {len(items) - 3} more" if len(items) > 3 else ""
            parts.append(f"{label}: {', '.join(items[:3])}{more}")
    return "; ".join(parts)
