"""Value checks that types alone cannot express; each error names the key and the rule."""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..utils.metrics import direction
from .schema import COMPONENTS, SECTIONS, Config, DataConfig, NoOptions, TrainConfig, components
from .text import did_you_mean


def validate(cfg: Config) -> None:
    """Value checks that types alone cannot express; each error names the key and the rule."""
    checks = [
        *_train_checks(cfg.train),
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
    _check_finite(cfg)
    _check_best(cfg)
    targets = components("task")[cfg.task.name].targets
    if cfg.data.sampler == "balanced" and targets != "class":  # it draws by class id
        raise ConfigError(
            f"data.sampler=balanced draws by class, and task.name={cfg.task.name} has "
            f"{targets} targets, not classes; use data.sampler=shuffle"
        )
    # >>> fsdp
    conflict = _strategy_conflict(cfg.train)
    if conflict:
        raise ConfigError(conflict)
    # <<< fsdp
    device = cfg.run.device
    if not (device in ("auto", "cpu", "cuda", "mps") or _is_cuda_index(device)):
        raise ConfigError(f"run.device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")


def _check_finite(cfg: Config) -> None:
    """One rule for every number of the config, the components' options included: nan and
    inf are refused (train.weight_decay=inf was accepted and turned every weight into nan)."""
    for section in SECTIONS:
        part = getattr(cfg, section)
        values = {**vars(part), **vars(getattr(part, "options", None) or NoOptions())}
        for name, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{section}.{name} must be a finite number, got {value}")


WARMUP_RULE = "a step count (a whole number >= 0) or a fraction of the planned steps below 1"


def _is_warmup(value: float) -> bool:
    """A whole number of steps, or a fraction in [0, 1) (nan and inf fail every test)."""
    return math.isfinite(value) and value >= 0 and (value < 1 or value == int(value))


def _check_best(cfg: Config) -> None:
    """train.best_metric: a scalar metric of the task, or one entry of a vector metric
    (`f1/<class name>`; that the class exists is checked once the data is read,
    tasks.check_metric), never a whole vector."""
    task = components("task")[cfg.task.name]
    directions, vectors = task.metrics, getattr(task, "vector_metrics", ())
    metric = cfg.train.best_metric
    if metric in vectors:
        scalars = ", ".join(m for m in directions if m not in vectors)
        raise ConfigError(
            f"train.best_metric={metric} is a vector (one value per class); choose one entry, "
            f"{metric}/<class name>, or a scalar: {scalars}"
        )
    if metric != "auto" and metric not in directions and metric.split("/")[0] not in vectors:
        raise ConfigError(
            f"train.best_metric={metric!r} is not a metric of task.name={cfg.task.name}; "
            f"choose auto or one of {', '.join(directions)}{did_you_mean(metric, directions)}"
        )
    metric, natural = cfg.best()[0], direction(directions, cfg.best()[0])
    if cfg.train.best_mode not in ("auto", natural):
        raise ConfigError(
            f"train.best_mode={cfg.train.best_mode} would keep the worst {metric} "
            f"as best.pt; use train.best_mode={natural} or auto"
        )


# >>> fsdp
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
    if train.ema_decay:  # the average would be of this rank's shards, saved unsharded
        return "train.ema_decay is not supported with train.strategy=fsdp yet; use ddp, or 0"
    if train.micro_batch_size:  # its collectives in forward/backward: a rank out of memory
        return (  # would leave the others waiting (Composer's FSDP2 finding); unproven on GPU
            "train.micro_batch_size is not supported with train.strategy=fsdp yet; use ddp, "
            "or train.micro_batch_size=0"
        )
    return None
# <<< fsdp


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


FINITE = "a finite number >= 0"
MICRO_BATCH_RULE = "auto, 0 (whole batches) or between 1 and train.batch_size"
NO_SYNC_BN = (  # a rank out of memory would leave the others waiting in the forward pass
    "0 with train.sync_bn=true (its BatchNorm's collectives are inside the forward pass)"
)


def _is_micro_batch(train: TrainConfig) -> bool:
    size = train.micro_batch_size
    return size == "auto" or 0 <= size <= train.batch_size


def _train_checks(train: TrainConfig) -> list[tuple[str, bool, str]]:
    """The train section's (key, ok, rule)."""
    return [
        # 0 trained nothing and still printed the next commands, for files it never wrote.
        ("train.epochs", train.epochs >= 1, ">= 1"),
        ("train.batch_size", train.batch_size >= 1, ">= 1"),
        ("train.lr", train.lr > 0 and math.isfinite(train.lr), "a finite number > 0"),
        ("train.ref_batch_size", train.ref_batch_size >= 1, ">= 1"),
        ("train.weight_decay", train.weight_decay >= 0, ">= 0"),
        ("train.warmup_steps", _is_warmup(train.warmup_steps), WARMUP_RULE),
        ("train.min_lr_ratio", 0 <= train.min_lr_ratio <= 1, "between 0 and 1"),
        ("train.grad_accum_steps", train.grad_accum_steps >= 1, ">= 1"),
        ("train.micro_batch_size", _is_micro_batch(train), MICRO_BATCH_RULE),
        ("train.micro_batch_size", not (train.sync_bn and train.micro_batch_size), NO_SYNC_BN),
        ("train.grad_clip", train.grad_clip >= 0, ">= 0 (0 turns clipping off)"),
        ("train.ema_decay", 0 <= train.ema_decay < 1, "in [0, 1) (0 = no averaging)"),
        ("train.max_skipped", train.max_skipped >= 1, ">= 1"),
        ("train.max_steps", train.max_steps >= 0, ">= 0 (0 = no limit)"),
        ("train.keep_last", train.keep_last >= 1, ">= 1"),
        ("train.freeze_epochs", train.freeze_epochs >= -1, ">= 0, or -1 (always frozen)"),
        ("train.backbone_lr_ratio", 0 < train.backbone_lr_ratio <= 10, "in (0, 10]"),
        ("train.early_stop_patience", train.early_stop_patience >= 0, ">= 0 (0 = off)"),
        ("train.early_stop_min_delta", 0 <= train.early_stop_min_delta < math.inf, FINITE),
    ]
