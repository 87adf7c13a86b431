"""Weight averaging (train.ema_decay > 0): an exponential moving average of the weights,
updated after each optimizer step. It is what validation scores, what picks best.pt and what
the tools read (checkpoint.model_weights takes a checkpoint's "ema" entry first); "model"
stays the weights being trained, which a resume continues.

torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn (one foreach lerp per dtype):
ema = decay * ema + (1 - decay) * weights, the first update a copy. use_buffers=True averages
BatchNorm's running statistics with the weights, so the averaged model is validated with
statistics that match it; a counter (BatchNorm's num_batches_tracked) is the trained model's
own, not an average."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def build(model: nn.Module, decay: float) -> AveragedModel | None:
    """The average of `model`'s weights on their device, or None when train.ema_decay is 0."""
    if not decay:
        return None
    return AveragedModel(model, multi_avg_fn=_averaging(decay), use_buffers=True)


def _averaging(decay: float):
    """AveragedModel's update of one group of tensors (one device and dtype)."""
    lerp = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def update(averaged: list, current: list, n_averaged) -> None:
        if averaged[0].is_floating_point() or averaged[0].is_complex():
            lerp(averaged, current, n_averaged)
        else:  # counters: an average of a count counts nothing
            for a, c in zip(averaged, current, strict=True):
                a.copy_(c)

    return update


def weights(state: dict) -> dict:
    """The averaged model's state_dict from a checkpoint's "ema" entry (AveragedModel's own
    state_dict: the module's keys behind "module.", and its update count)."""
    prefix = "module."
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
