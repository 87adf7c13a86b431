"""A trained model for inference, from its checkpoint alone: the model rebuilt from the saved
config and "io" (input shape and dtype, output size), its weights, and the data meta that says
how to read new inputs (classes, normalisation, image size, vocabulary) and its outputs
(regression targets' mean and std, through the task). predict.py and export.py start here;  # feature: export
(regression targets' mean and std, through the task). predict.py starts here;  # feature: !export
the validation split is rebuilt only where real samples are needed.

Mixed precision: predict.py, like evaluate.py, runs the model under the checkpoint's
train.amp. Its validation metrics, and so the choice of best.pt, were measured under it: in
a bf16 run, fp32 would give other probabilities (and now and then another class) than the
metrics that picked the model, and than evaluate.py. --amp (predict) or train.amp=...
(evaluate) overrides it; both choose by inference_amp, under training's rule for the device
(fp16 needs a GPU). An exported artifact computes in fp32.  # feature: export
(fp16 needs a GPU).  # feature: !export
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from .. import checkpoint
from ..config import Config, load_config
from ..data import example_inputs
from ..errors import ConfigError
from ..models import architecture, build_model, example_of, model_io
from ..tasks import frozen_task
from ..trainer import build_data
from ..utils.device import check_amp, resolve_device
from .reproduce import drift


@dataclass
class Trained:
    model: nn.Module  # in eval mode, on the CPU
    cfg: Config  # the training run's config
    meta: dict  # the data meta saved with it
    io: dict  # models.model_io: input shape and dtype, output size
    path: str
    step: int | None = None  # the optimizer step it was saved at
    record: dict | None = None  # what made the run (utils/provenance.py), when saved with it

    @property
    def classes(self) -> list[str] | None:
        """Class names of a classifier: the data's, else the ids as text; None otherwise."""
        if self.cfg.task.name != "classification":
            return None
        return self.meta.get("classes") or [str(i) for i in range(self.io["num_outputs"])]

    @cached_property
    def task(self):
        """The run's task, from the checkpoint alone, its tuned decisions frozen: its size
        from io, its target statistics and thresholds from meta; `task.decode(model(x))` is
        a prediction in the targets' own units."""
        return frozen_task(self.cfg.task, self.io["num_outputs"], self.meta)


def load_trained(path: str, overrides: list[str] = ()) -> Trained:
    """The checkpoint's model with its weights, in eval mode on the CPU. A checkpoint saved
    before "io" existed gets it from its rebuilt training data."""
    state = checkpoint.load(path)
    saved = state.get("config") if isinstance(state.get("config"), dict) else {}
    cfg = load_config(base=saved, overrides=overrides)
    meta = state.get("data") if isinstance(state.get("data"), dict) else {}
    io = state.get("io")
    if not isinstance(io, dict):
        train_set, _, meta, task = build_data(cfg, meta or None)
        io = model_io(example_inputs(train_set), task.num_outputs)
    model = build_model(architecture(cfg.model), example_of(io), io["num_outputs"])
    checkpoint.load_model_state(model, checkpoint.model_weights(state, path), path)
    step = (
        state.get("progress", {}).get("step") if isinstance(state.get("progress"), dict) else None
    )
    meta_part = state.get("meta") if isinstance(state.get("meta"), dict) else {}
    record = meta_part.get("record") if isinstance(meta_part.get("record"), dict) else None
    return Trained(model.eval(), cfg, meta, io, path, step, record)


def say_drift(trained: Trained) -> None:
    """After a tool's work: one line on stderr (--json's stdout stays one line) when the
    checkpoint was trained on other code or data than is here (reproduce.drift)."""
    line = drift(trained.record, trained.cfg.run.output_dir)
    if line and os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr)


def validation_set(trained: Trained):
    """The training run's validation split, read with its meta (as evaluate.py does)."""
    return build_data(trained.cfg, trained.meta or None)[1]


def validation_inputs(trained: Trained, n: int) -> torch.Tensor:
    """Up to `n` validation inputs as one batch."""
    return example_inputs(validation_set(trained), n)


def device_option(device: str) -> torch.device:
    """The device a tool's --device names (auto, cpu, cuda, cuda:N, mps), or one line."""
    index = device.removeprefix("cuda:")
    if device not in ("auto", "cpu", "cuda", "mps") and not (device != index and index.isdigit()):
        raise ConfigError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    try:
        return resolve_device(device)
    except ConfigError as exc:  # its message names the config key; here it is the option
        raise ConfigError(str(exc).replace("run.device", "--device")) from None


def inference_amp(
    trained: Trained, device: torch.device, amp: str | None = None, option: str = "--amp"
) -> str:
    """The mixed precision to run the checkpoint's model under, for predict.py and
    evaluate.py alike: `amp` (predict's --amp) if given, else the checkpoint's train.amp (in
    evaluate.py, with its train.amp=... override; see the docstring above). Checked for the
    device as training checks it: fp16 on the CPU, or bf16 where it is only emulated, is one
    line naming `option`, the way to choose another."""
    chosen = trained.cfg.train.amp if amp is None else amp
    try:
        check_amp(chosen, device)
    except ConfigError as exc:  # its message names the config key; say where it came from
        message = str(exc).replace("train.amp", option)
        if amp is None:
            message = (
                f"checkpoint {trained.path!r} runs under its train.amp={chosen} unless {option} "
                f"says otherwise, and {message}"
            )
        raise ConfigError(message) from None
    return chosen
