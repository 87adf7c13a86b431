"""Steps whose loss or gradient norm is not finite (inf, nan).

train.on_nonfinite=stop (the default): the run stops with one line at the next loss read
(read_losses, every run.log_every steps: reading a loss waits for the GPU), the last good
checkpoint kept. skip: such a step is dropped on every rank together (one all-reduce of a
flag, and a wait for the GPU, each step: the cost of the option), with no optimizer, schedule
or average update; fp16's GradScaler backs its scale off as for its own skips, which this
counts the same way. The skips are counted in Progress (saved, so a resume continues the
count), in the epoch line and metrics.csv, and train.max_skipped skips in a row stop the run
as `stop` does."""

from __future__ import annotations

import torch

from . import distributed
from .errors import UserError

ADVICE = "lower train.lr, use train.amp=bf16, or check the data"


class NonFiniteLoss(UserError):
    pass


def skip_step(loop, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """Whether this step is dropped (train.on_nonfinite=skip), as every rank agrees."""
    bad = ~(torch.isfinite(loss) & torch.isfinite(torch.as_tensor(grad_norm)))
    bad = distributed.all_reduce_max(bad.float().reshape(1).to(loop.device)).item() > 0
    progress = loop.progress
    if not bad:
        progress.skipped_in_a_row = 0
        return False
    progress.skipped += 1
    progress.skipped_in_a_row += 1
    if progress.skipped_in_a_row > loop.train.max_skipped:
        raise NonFiniteLoss(
            f"loss or gradient not finite at {progress.skipped_in_a_row} steps in a row, up to "
            f"step {progress.step + 1} (train.max_skipped={loop.train.max_skipped}); "
            f"stopped, the last good checkpoint is kept ({ADVICE})"
        )
    return True


def read_losses(loop, losses: list[torch.Tensor], steps: int) -> tuple[float, bool]:
    """Mean loss over ranks of the last `steps` steps, and whether any rank was asked to stop.
    Raises NonFiniteLoss naming the first step whose loss was not finite; with
    train.on_nonfinite=skip the skipped steps' (nan) are left out of the mean instead."""
    step_losses = torch.stack(losses).view(steps, -1).mean(1)  # (steps,): one mean per step
    bad = ~torch.isfinite(step_losses)
    skip = loop.train.on_nonfinite == "skip"
    first = bad.float().argmax() + (loop.progress.step - steps + 1)
    first_bad = torch.where(bad.any() & (not skip), first, -1).float()
    # One small collective carries everything the ranks must agree on.
    asked = torch.tensor(float(loop.stop.requested), device=loop.device)
    flags = distributed.all_reduce_max(torch.stack([first_bad, asked]))
    kept = (~bad).sum().to(step_losses.dtype)
    sums = distributed.all_reduce_sum(torch.stack([step_losses.nan_to_num(0, 0, 0).sum(), kept]))
    bad_step, any_stop = flags.tolist()
    if bad_step >= 0:
        raise NonFiniteLoss(
            f"loss is not finite at step {int(bad_step)}; stopped, the last good checkpoint "
            f"is kept ({ADVICE}; or train.on_nonfinite=skip to drop such steps)"
        )
    total, count = sums.tolist()
    if skip:  # the steps kept, over every rank
        return total / max(count, 1), bool(any_stop)
    return total / loop.dist.world_size / steps, bool(any_stop)
