"""The settings as dataclasses, one per section, with their defaults; `components()` is the
registry a section's `name` chooses from (data/, models/, tasks/), which adds its own options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import LEFT_OUT, ConfigError, left_out
from ..utils.metrics import direction
from ..utils.trackers import TRACKERS
from .text import did_you_mean

# Where metrics go: utils/logger.py (csv, tensorboard) and the trackers of utils/trackers.py
# (its registry; a Literal of those names, so an unknown one is refused with the choices).
Logger = Literal[("csv", "tensorboard", *TRACKERS)]


@dataclass
class RunConfig:
    name: str = "default"  # run folder <output_dir>/<name>/: checkpoints, logs, resolved config
    seed: int = 42  # base seed, 0 <= seed < 2**63; rank r seeds with a hash of (seed, r)
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    output_dir: str = "checkpoints"  # parent folder of every run folder
    deterministic: bool = False  # bitwise-reproducible kernels; slower, turns cudnn.benchmark off
    log_every: int = 50  # optimizer steps between loss reads (each read waits for the GPU)
    # Where metrics go: csv (metrics.csv + curves.png; always written) | tensorboard
    # >>> trackers
    # | wandb | mlflow. wandb and mlflow record offline inside the run folder unless
    # WANDB_MODE or MLFLOW_TRACKING_URI say otherwise; pip install them to use them.
    # <<< trackers
    loggers: list[Logger] = field(default_factory=lambda: ["csv", "tensorboard"])
    threads: int = 0  # torch CPU threads per process; 0 = auto (usable CPUs / local processes)
    # run.json records a digest of each data file; of a folder (images), its listing's, or
    # with hash_folders every file's bytes (slower at a folder's first run; then cached)
    hash_folders: bool = False


@dataclass
class DataConfig:
    name: str = "synthetic"  # a key of DATASETS in data/__init__.py; its own options sit beside
    num_workers: int = 0  # loader processes (at most 256); 0 suits in-memory data
    pin_memory: bool = True  # page-locked batches for faster host-to-GPU copies (CUDA only)
    val_fraction: float = 0.1  # held out for validation when a dataset has no val split of its own
    split_seed: int = (
        0  # shuffles the validation split and the folds; not run.seed, so seeds share them
    )
    folds: int = 0  # k-fold: K >= 2 splits the training split into K folds; 0 = off (own val)
    fold: int = 0  # k-fold: the fold used for validation, 0..folds-1; the rest trains
    # The training order: shuffle (a permutation per epoch) | balanced (classes drawn with
    # equal probability, with replacement, same epoch length; class targets only)
    sampler: Literal["shuffle", "balanced"] = "shuffle"
    options: Any = None  # the chosen dataset's Options (data/<name>.py): flat keys in YAML


@dataclass
class ModelConfig:
    name: str = "cnn"  # a key of MODELS in models/__init__.py; its own options sit beside
    options: Any = None  # the chosen model's Options (models/<name>.py): flat keys in YAML


@dataclass
class TaskConfig:
    name: str = "classification"  # a key of TASKS in tasks/__init__.py: loss and metrics
    options: Any = None  # the chosen task's Options (tasks/<name>.py): flat keys in YAML


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64  # per device; effective batch = batch_size * grad_accum_steps * ranks
    lr: float = 0.003  # peak learning rate at ref_batch_size
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # rescale lr for the effective batch
    ref_batch_size: int = 64  # the effective batch that `lr` was tuned for
    weight_decay: float = 0.05
    # Linear warm-up, then cosine decay: a step count (20), or below 1 a fraction of the
    # planned steps (0.05 = the first 5%), which fits runs of any length.
    warmup_steps: int | float = 0.05
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    # Each batch through forward/backward in parts of this size, the step's math unchanged
    # (microbatch.py): 0 = whole batches | N | auto: halve on out-of-memory, at any step
    micro_batch_size: int | Literal["auto"] = 0
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping (norm still logged)
    # A step whose loss or gradient norm is inf/nan: stop the run (one line, the last good
    # checkpoint kept) | skip it on every rank (nonfinite.py; a GPU wait per step), stopping
    # after max_skipped in a row
    on_nonfinite: Literal["stop", "skip"] = "stop"
    max_skipped: int = 10
    # Weight averaging: an EMA of the weights after each step (ema.py), validated, best.pt's
    # and the tools' weights; 0 = off. 0.999 averages about the last 1000 steps.
    ema_decay: float = 0.0
    amp: Literal["off", "bf16", "fp16"] = "off"  # mixed precision; fp16 adds a GradScaler
    compile: bool = False  # torch.compile the model (pays off on GPU for long runs)
    channels_last: bool = False  # NHWC memory format for conv nets (faster on tensor cores)
    tf32: bool = True  # TF32 matmuls/convolutions on Ampere+ GPUs
    sync_bn: bool = False  # SyncBatchNorm across ranks (distributed runs only)
    strategy: Literal["ddp", "fsdp"] = "ddp"  # ddp: a full copy per rank | fsdp: sharded (FSDP2)  # feature: fsdp
    strategy: Literal["ddp"] = "ddp"  # how ranks share the model: a full copy each (parallel.py)  # feature: !fsdp
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    cpu_offload: bool = False  # fsdp on CUDA: sharded params, grads, optimizer state in CPU RAM  # feature: fsdp
    max_steps: int = 0  # end the run (validated) and the lr schedule here; 0 = all epochs
    resume: str = ""  # "" fresh run | auto: newest loadable checkpoint of this run | a path
    init_from: str = ""  # a checkpoint whose model weights start a new run (fine-tuning)
    # Fine-tuning (finetune.py): the backbone, all but the model's head, is frozen for the
    # first freeze_epochs epochs (-1 = all: a linear probe), then trains at backbone_lr_ratio
    # x the head's lr; its BatchNorm statistics stay fixed while it is frozen, or always.
    freeze_epochs: int = 0
    backbone_lr_ratio: float = 1.0
    bn_frozen: Literal["with_backbone", "always"] = "with_backbone"
    keep_last: int = 2  # step checkpoints kept besides best.pt
    best_metric: str = "auto"  # validation metric that picks best.pt; auto: the task's first
    best_mode: Literal["auto", "max", "min"] = "auto"  # auto: the metric's own (acc max, loss min)
    early_stop_patience: int = 0  # stop after N epochs without a better best_metric; 0 = off
    early_stop_min_delta: float = 0.0  # early stopping: a smaller improvement counts as none


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        for section in COMPONENTS:  # a bare Config() gets its components' default options
            part = getattr(self, section)
            if part.options is None:
                part.options = options_type(section, part.name)()

    def best(self) -> tuple[str, str]:
        """The validation metric that picks best.pt and whether it improves up (max) or down."""
        directions = components("task")[self.task.name].metrics
        metric = self.train.best_metric
        metric = next(iter(directions)) if metric == "auto" else metric
        if self.train.best_mode != "auto":
            return metric, self.train.best_mode
        return metric, direction(directions, metric)  # f1/<class>: the vector f1's

    def tie_break(self) -> tuple[str, str]:
        """The metric that decides between equal values of best(): the loss (lower is better),
        or when best() is the loss, the task's first other metric."""
        directions = components("task")[self.task.name].metrics
        best = self.best()[0]
        metric = "loss" if best != "loss" else next(m for m in directions if m != "loss")
        return metric, directions[metric]


SECTIONS = {
    "run": RunConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "task": TaskConfig,
    "train": TrainConfig,
}


# Sections that choose a component from a registry: their `name` picks it, and the
# component's own options (a dataclass beside it) sit in the same section.
COMPONENTS = {"data": "DATASETS", "model": "MODELS", "task": "TASKS"}


def components(section: str) -> dict:
    """The registry a section chooses from, imported when first needed (the registries import
    torch; reading a config does not need it)."""
    from .. import data, models, tasks

    return {"data": data.DATASETS, "model": models.MODELS, "task": tasks.TASKS}[section]


def options_type(section: str, name: str) -> type:
    """The Options dataclass of component `name` of `section`; ConfigError for unknown names."""
    registry = components(section)
    if name not in registry and f"{section}.name={name}" in LEFT_OUT:  # a fuller project's
        raise ConfigError(left_out(f"{section}.name={name}"))
    if name not in registry:
        raise ConfigError(
            f"{section}.name={name!r} is not one of the registered choices "
            f"{', '.join(registry)}{did_you_mean(name, registry)}"
        )
    return getattr(registry[name], "Options", NoOptions)


@dataclass
class NoOptions:
    """For components that take no options."""
