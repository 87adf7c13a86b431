"""Typed configuration: YAML files and `key=value` overrides on top of dataclass defaults.

Precedence, later wins: dataclass defaults < config file (after the files it `extends`) <
command-line overrides. `configs/default.yaml` mirrors the defaults below (a test keeps the two
equal); experiment files start with `extends: ../default.yaml` and hold only what changes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .config_text import closest, coerce, parse_value, read_file
from .errors import ConfigError

Logger = Literal["csv", "tensorboard", "wandb", "mlflow"]  # see utils/logger.py, utils/trackers.py


@dataclass
class RunConfig:
    name: str = "default"  # run folder <output_dir>/<name>/: checkpoints, logs, resolved config
    seed: int = 42  # base seed, 0 <= seed < 2**63; rank r seeds with a hash of (seed, r)
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    output_dir: str = "checkpoints"  # parent folder of every run folder
    deterministic: bool = False  # bitwise-reproducible kernels; slower, turns cudnn.benchmark off
    log_every: int = 50  # optimizer steps between loss reads (each read waits for the GPU)
    # Where metrics go: csv (metrics.csv + curves.png; always written) | tensorboard | wandb |
    # mlflow. wandb and mlflow record offline inside the run folder unless WANDB_MODE or
    # MLFLOW_TRACKING_URI say otherwise; pip install them to use them.
    loggers: list[Logger] = field(default_factory=lambda: ["csv", "tensorboard"])
    threads: int = 0  # torch CPU threads per process; 0 = auto (usable CPUs / local processes)


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
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping (norm still logged)
    amp: Literal["off", "bf16", "fp16"] = "off"  # mixed precision; fp16 adds a GradScaler
    compile: bool = False  # torch.compile the model (pays off on GPU for long runs)
    channels_last: bool = False  # NHWC memory format for conv nets (faster on tensor cores)
    tf32: bool = True  # TF32 matmuls/convolutions on Ampere+ GPUs
    sync_bn: bool = False  # SyncBatchNorm across ranks (distributed runs only)
    strategy: Literal["ddp", "fsdp"] = "ddp"  # ddp: a full copy per rank | fsdp: sharded (FSDP2)
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    cpu_offload: bool = False  # fsdp on CUDA: sharded params, grads, optimizer state in CPU RAM
    max_steps: int = 0  # end the run (validated) and the lr schedule here; 0 = all epochs
    resume: str = ""  # "" fresh run | auto: newest loadable checkpoint of this run | a path
    init_from: str = ""  # a checkpoint whose model weights start a new run (fine-tuning)
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
        return metric, directions[
            metric
        ] if self.train.best_mode == "auto" else self.train.best_mode

    def tie_break(self) -> tuple[str, str]:
        """The metric that decides between equal values of best(): the loss (lower is better),
        or when best() is the loss, the task's first other metric."""
        directions = components("task")[self.task.name].metrics
        best = self.best()[0]
        metric = "loss" if best != "loss" else next(m for m in directions if m != "loss")
        return metric, directions[metric]


_SECTIONS = {
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
    """The registry a section chooses from. Imported when first needed: the registries import
    this module for their types, so importing them at the top would be circular."""
    from . import data, models, tasks

    return {"data": data.DATASETS, "model": models.MODELS, "task": tasks.TASKS}[section]


def options_type(section: str, name: str) -> type:
    """The Options dataclass of component `name` of `section`; ConfigError for unknown names."""
    registry = components(section)
    if name not in registry:
        close = closest(name, registry)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(
            f"{section}.name={name!r} is not one of the registered choices "
            f"{', '.join(registry)}{hint}"
        )
    return getattr(registry[name], "Options", NoOptions)


@dataclass
class NoOptions:
    """For components that take no options."""


def load_config(
    path: str | Path | None = None, overrides: typing.Sequence[str] = (), base: dict | None = None
) -> Config:
    """Defaults, then the file at `path` (or the dict `base`, e.g. a checkpoint's config),
    then `key=value` overrides; validated."""
    data: dict = read_file(Path(path), _merge) if path else _merge({}, base or {})
    # All overrides form one layer, so their order does not matter: model.width=8
    # model.name=mlp sets the mlp's width (a component's options from the layers below are
    # dropped when a layer chooses another component).
    top: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value, e.g. train.epochs=3")
        *parents, leaf = key.strip().split(".")
        node, below = top, data
        for part in parents:  # each part before the key must be a section, not a value
            below = below.get(part) if isinstance(below, dict) else None
            node = node.setdefault(part, {})
            if not isinstance(node, dict) or not isinstance(below, dict | None):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
        node[leaf] = parse_value(item, raw)
    cfg = from_dict(_merge(data, top))
    validate(cfg)
    return cfg


def from_dict(data: dict) -> Config:
    """Build a Config from nested dicts, refusing unknown keys and wrong types."""
    return _build(Config, data, prefix="")


def to_dict(cfg: Config) -> dict:
    """Nested plain dicts; each component's options flat in its section, as in the YAML."""
    out = {}
    for f in dataclasses.fields(cfg):
        section = dataclasses.asdict(getattr(cfg, f.name))
        section.update(section.pop("options", None) or {})
        out[f.name] = section
    return out


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: a config dict as dotted keys."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def save_config(cfg: Config, path: Path) -> None:
    """Write via a temporary file and a rename: a full disk never leaves half a config."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def validate(cfg: Config) -> None:
    """Value checks that types alone cannot express; each error names the key and the rule."""
    checks = [
        ("train.epochs", cfg.train.epochs >= 0, ">= 0"),
        ("train.batch_size", cfg.train.batch_size >= 1, ">= 1"),
        ("train.lr", cfg.train.lr > 0 and math.isfinite(cfg.train.lr), "a finite number > 0"),
        ("train.ref_batch_size", cfg.train.ref_batch_size >= 1, ">= 1"),
        ("train.weight_decay", cfg.train.weight_decay >= 0, ">= 0"),
        ("train.warmup_steps", _is_warmup(cfg.train.warmup_steps), WARMUP_RULE),
        ("train.min_lr_ratio", 0 <= cfg.train.min_lr_ratio <= 1, "between 0 and 1"),
        ("train.grad_accum_steps", cfg.train.grad_accum_steps >= 1, ">= 1"),
        ("train.grad_clip", cfg.train.grad_clip >= 0, ">= 0 (0 turns clipping off)"),
        ("train.max_steps", cfg.train.max_steps >= 0, ">= 0 (0 = no limit)"),
        ("train.keep_last", cfg.train.keep_last >= 1, ">= 1"),
        ("train.early_stop_patience", cfg.train.early_stop_patience >= 0, ">= 0 (0 = off)"),
        (
            "train.early_stop_min_delta",
            0 <= cfg.train.early_stop_min_delta < math.inf,
            "a finite number >= 0",
        ),
        ("data.num_workers", 0 <= cfg.data.num_workers <= 256, "between 0 and 256"),
        ("data.val_fraction", 0 < cfg.data.val_fraction < 1, "between 0 and 1, exclusive"),
        ("data.folds", cfg.data.folds == 0 or cfg.data.folds >= 2, "0 (off) or >= 2"),
        ("data.fold", _fold_in_range(cfg.data), _fold_rule(cfg.data)),
        ("data.split_seed", 0 <= cfg.data.split_seed < 2**63, "between 0 and 2**63 - 1"),
        ("run.log_every", cfg.run.log_every >= 1, ">= 1"),
        ("run.threads", cfg.run.threads >= 0, ">= 1, or 0 for auto"),
        # torch seeds are 64-bit; ranks and epochs hash (seed, rank/epoch) into one (mix_seed).
        ("run.seed", 0 <= cfg.run.seed < 2**63, "between 0 and 2**63 - 1"),
        ("run.name", _is_plain_name(cfg.run.name), "a folder name (letters, digits, - _ .)"),
    ]
    for section in COMPONENTS:  # each component checks its own options: (key, ok, rule)
        options = getattr(cfg, section).options
        if hasattr(options, "checks"):
            checks += [(f"{section}.{key}", ok, rule) for key, ok, rule in options.checks()]
    for key, ok, rule in checks:
        if not ok:
            section, name = key.split(".")
            part = getattr(cfg, section)
            value = getattr(part, name) if hasattr(part, name) else getattr(part.options, name)
            raise ConfigError(f"{key} must be {rule}, got {value!r}")
    _check_best(cfg)
    conflict = _strategy_conflict(cfg.train)
    if conflict:
        raise ConfigError(conflict)
    device = cfg.run.device
    if not (device in ("auto", "cpu", "cuda", "mps") or _is_cuda_index(device)):
        raise ConfigError(f"run.device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")


WARMUP_RULE = "a step count (a whole number >= 0) or a fraction of the planned steps below 1"


def _is_warmup(value: float) -> bool:
    """A whole number of steps, or a fraction in [0, 1) (nan and inf fail every test)."""
    return math.isfinite(value) and value >= 0 and (value < 1 or value == int(value))


def _check_best(cfg: Config) -> None:
    directions = components("task")[cfg.task.name].metrics
    metric = cfg.train.best_metric
    if metric != "auto" and metric not in directions:
        close = closest(metric, directions)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(
            f"train.best_metric={metric!r} is not a metric of task.name={cfg.task.name}; "
            f"choose auto or one of {', '.join(directions)}{hint}"
        )
    metric, natural = cfg.best()[0], directions[cfg.best()[0]]
    if cfg.train.best_mode not in ("auto", natural):
        raise ConfigError(
            f"train.best_mode={cfg.train.best_mode} would keep the worst {metric} "
            f"as best.pt; use train.best_mode={natural} or auto"
        )


def _strategy_conflict(train: TrainConfig) -> str | None:
    """Settings that train.strategy cannot honour, as one line; None when they fit."""
    if train.strategy == "ddp":
        if train.cpu_offload:
            return "train.cpu_offload=true needs train.strategy=fsdp (ddp keeps all on the GPU)"
        return None
    if train.sync_bn:
        return (
            "train.sync_bn=true is not supported with train.strategy=fsdp; use train.sync_bn="
            "false (BatchNorm statistics are synchronised before validation), or ddp"
        )
    if train.amp == "fp16":
        # fp16 needs loss scaling of sharded gradients (a ShardedGradScaler); bf16 has fp32's
        # range and needs none.
        return (
            "train.amp=fp16 is not supported with train.strategy=fsdp; use train.amp=bf16 "
            "(no loss scaling needed), or train.strategy=ddp"
        )
    return None


def _fold_in_range(data: DataConfig) -> bool:
    # With folds off, a nonzero fold would be silently ignored: refuse it instead.
    return 0 <= data.fold < data.folds if data.folds >= 2 else data.fold == 0


def _fold_rule(data: DataConfig) -> str:
    if data.folds >= 2:
        return f"between 0 and data.folds - 1 = {data.folds - 1}"
    return "0 while data.folds is 0 (set data.folds=K to use k-fold)"


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and all(c.isalnum() or c in "-_." for c in name)


def _is_cuda_index(device: str) -> bool:
    return device.startswith("cuda:") and device[5:].isdigit()


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(_common_only(key, out[key], value), value)
        else:
            out[key] = value
    return out


def _common_only(section: str, base: dict, top: dict) -> dict:
    """`base` without its component options when `top` chooses another component: a file
    extending default.yaml with data.name=csv must not inherit the synthetic data's sizes."""
    if section not in COMPONENTS or "name" not in top:
        return base
    if top["name"] == base.get("name", _SECTIONS[section].name):
        return base
    common = {f.name for f in dataclasses.fields(_SECTIONS[section])}
    return {k: v for k, v in base.items() if k in common}


# Keys of earlier versions of this project, and what replaced them.
RENAMED = {
    "run.tensorboard": "run.loggers (a list: run.loggers=csv,tensorboard; false: run.loggers=csv)",
    "data.fold_seed": "data.split_seed (it seeds the validation split too)",
}


def _unknown_key(cls, prefix: str, key: str, value: Any) -> str:
    """The error for a key that `cls` lacks, with the closest valid key. The section and the
    key are matched apart: `trian.epochs` gets section train, then the key epochs within it."""
    if f"{prefix}{key}" in RENAMED:  # a config or checkpoint of an earlier version
        return f"config key '{prefix}{key}' is now {RENAMED[prefix + key]}"
    hints = typing.get_type_hints(cls)
    name, guess = f"{prefix}{key}", closest(key, hints)
    if isinstance(value, dict) and value:  # a misspelt section: name its first key too
        inner = str(next(iter(value)))
        name += f".{inner}"
        if guess and dataclasses.is_dataclass(hints[guess]):
            sub = closest(inner, typing.get_type_hints(hints[guess]))
            guess = f"{guess}.{sub}" if sub else guess
    if guess is None:  # a key of one other section: train.seed -> run.seed, epochs -> train.epochs
        leaf = closest(key, {k.rpartition(".")[2] for k in _all_keys()})
        found = [k for k in _all_keys() if leaf and k.endswith(f".{leaf}")]
        guess = found[0] if len(found) == 1 else None
    else:
        guess = prefix + guess
    hint = f" (did you mean '{guess}'?)" if guess else ""
    return f"unknown config key '{name}'{hint}"


def _all_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every key of the config, the default components' options included."""
    keys = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            keys += _all_keys(hint, f"{prefix}{f.name}.")
        elif f.name == "options":
            section = prefix.rstrip(".")
            keys += _all_keys(options_type(section, _SECTIONS[section].name), prefix)
        else:
            keys.append(prefix + f.name)
    return keys


def _build(cls, data: Any, prefix: str):
    if data is None and prefix:  # a section whose lines are all commented out
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a section (key: value lines)")
    if cls in (DataConfig, ModelConfig, TaskConfig):
        return _build_component(cls, data, prefix)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(_unknown_key(cls, prefix, str(key), data[key]))
    values = {}
    for name in known & data.keys():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, data[name], f"{prefix}{name}.")
        else:
            values[name] = coerce(data[name], hint, prefix + name)
    return cls(**values)


def _build_component(cls, data: dict, prefix: str):
    """A section whose `name` chooses a component: its own keys, then the component's options
    (every other key), each checked against the component's Options dataclass."""
    section = prefix.rstrip(".")
    name = coerce(data.get("name", cls.name), str, f"{section}.name")
    options_cls = options_type(section, name)
    common = {f.name for f in dataclasses.fields(cls)} - {"options"}
    own = set(typing.get_type_hints(options_cls))
    for key in data:
        if f"{section}.{key}" in RENAMED:
            raise ConfigError(_unknown_key(cls, prefix, str(key), data[key]))
        if key not in common | own:
            raise ConfigError(_unknown_option(section, name, str(key), common | own))
    values = {
        k: coerce(data[k], typing.get_type_hints(cls)[k], prefix + k) for k in common & data.keys()
    }
    options = _build(options_cls, {k: v for k, v in data.items() if k in own}, prefix)
    return cls(**values, options=options)


def _unknown_option(section: str, name: str, key: str, known: set[str]) -> str:
    """Did you mean a key of this component, or is it an option of another one?"""
    guess = closest(key, known)
    if guess:
        return f"unknown config key '{section}.{key}' (did you mean '{section}.{guess}'?)"
    owners = [
        other
        for other, component in components(section).items()
        if key in typing.get_type_hints(getattr(component, "Options", NoOptions))
    ]
    if owners:
        return (
            f"{section}.{key} is not an option of {section}.name={name}; it belongs to "
            f"{section}.name={' or '.join(owners)}"
        )
    listed = ", ".join(sorted(known)) or "none"
    return f"unknown config key '{section}.{key}' for {section}.name={name} (its keys: {listed})"
