"""Typed configuration: YAML files and `key=value` overrides on top of dataclass defaults.

Precedence, later wins: dataclass defaults < config file (after the files it `extends`) <
command-line overrides. `configs/default.yaml` mirrors the defaults below (a test keeps the two
equal); experiment files start with `extends: ../default.yaml` and hold only what changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import ConfigError

Logger = Literal["csv", "tensorboard", "wandb", "mlflow"]  # see utils/logger.py, utils/trackers.py


@dataclass
class RunConfig:
    name: str = "default"  # run folder <output_dir>/<name>/: checkpoints, logs, resolved config
    seed: int = 42  # base seed, 0 <= seed < 2**63; rank r of a distributed run uses seed + r
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
    name: str = "synthetic"  # a key of DATASETS in data/__init__.py
    root: str = "data"  # folder of file-based datasets
    train_size: int = 4096  # synthetic: samples in the training split
    val_size: int = 1024  # synthetic: samples in the validation split
    image_size: int = 16  # synthetic: height = width of the images
    num_classes: int = 10  # synthetic: number of classes
    num_workers: int = 0  # loader processes (at most 256); 0 suits in-memory data
    pin_memory: bool = True  # page-locked batches for faster host-to-GPU copies (CUDA only)
    folds: int = 0  # k-fold: K >= 2 splits the training split into K folds; 0 = off (own val)
    fold: int = 0  # k-fold: the fold used for validation, 0..folds-1; the rest trains
    fold_seed: int = 0  # k-fold: shuffles the fold assignment; not run.seed, so seeds share folds


@dataclass
class ModelConfig:
    name: str = "cnn"  # a key of MODELS in models/__init__.py
    width: int = 32  # channels of the first block (cnn) / hidden units (mlp)
    depth: int = 2  # conv blocks (cnn) / hidden layers (mlp), at most 64
    dropout: float = 0.1  # before the classifier head


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64  # per device; effective batch = batch_size * grad_accum_steps * ranks
    lr: float = 0.003  # peak learning rate at ref_batch_size
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # rescale lr for the effective batch
    ref_batch_size: int = 64  # the effective batch that `lr` was tuned for
    weight_decay: float = 0.05
    warmup_steps: int = 50  # linear warm-up in optimizer steps, then cosine decay
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping (norm still logged)
    amp: Literal["off", "bf16", "fp16"] = "off"  # mixed precision; fp16 adds a GradScaler
    compile: bool = False  # torch.compile the model (pays off on GPU for long runs)
    channels_last: bool = False  # NHWC memory format for conv nets (faster on tensor cores)
    tf32: bool = True  # TF32 matmuls/convolutions on Ampere+ GPUs
    sync_bn: bool = False  # SyncBatchNorm across ranks (distributed runs only)
    max_steps: int = 0  # stop after this many optimizer steps in total; 0 = all epochs
    resume: str = ""  # "" fresh run | auto: newest loadable checkpoint of this run | a path
    init_from: str = ""  # a checkpoint whose model weights start a new run (fine-tuning)
    keep_last: int = 2  # step checkpoints kept besides best.pt
    best_metric: str = "acc"  # validation metric that picks best.pt: acc | loss
    best_mode: Literal["auto", "max", "min"] = "auto"  # auto: the metric's own (acc max, loss min)

    def best_direction(self) -> str:
        """max or min: which way best_metric improves."""
        return BEST_MODES[self.best_metric] if self.best_mode == "auto" else self.best_mode


BEST_MODES = {"acc": "max", "loss": "min"}  # how each validation metric improves


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def load_config(
    path: str | Path | None = None, overrides: typing.Sequence[str] = (), base: dict | None = None
) -> Config:
    """Defaults, then the file at `path` (or the dict `base`, e.g. a checkpoint's config),
    then `key=value` overrides; validated."""
    data: dict = _read_file(Path(path), seen=()) if path else _merge({}, base or {})
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value, e.g. train.epochs=3")
        node = data
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
        node[leaf] = _parse_value(item, raw)
    cfg = from_dict(data)
    validate(cfg)
    return cfg


def from_dict(data: dict) -> Config:
    """Build a Config from nested dicts, refusing unknown keys and wrong types."""
    return _build(Config, data, prefix="")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


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
        ("train.warmup_steps", cfg.train.warmup_steps >= 0, ">= 0"),
        ("train.min_lr_ratio", 0 <= cfg.train.min_lr_ratio <= 1, "between 0 and 1"),
        ("train.grad_accum_steps", cfg.train.grad_accum_steps >= 1, ">= 1"),
        ("train.grad_clip", cfg.train.grad_clip >= 0, ">= 0 (0 turns clipping off)"),
        ("train.max_steps", cfg.train.max_steps >= 0, ">= 0 (0 = no limit)"),
        ("train.keep_last", cfg.train.keep_last >= 1, ">= 1"),
        ("train.best_metric", cfg.train.best_metric in ("acc", "loss"), "acc or loss"),
        ("data.num_workers", 0 <= cfg.data.num_workers <= 256, "between 0 and 256"),
        ("data.train_size", cfg.data.train_size >= 1, ">= 1"),
        ("data.val_size", cfg.data.val_size >= 1, ">= 1"),
        ("data.image_size", cfg.data.image_size >= 4, ">= 4"),
        ("data.num_classes", cfg.data.num_classes >= 2, ">= 2"),
        ("data.folds", cfg.data.folds == 0 or cfg.data.folds >= 2, "0 (off) or >= 2"),
        ("data.fold", _fold_in_range(cfg.data), _fold_rule(cfg.data)),
        ("data.fold_seed", 0 <= cfg.data.fold_seed < 2**63, "between 0 and 2**63 - 1"),
        ("model.width", cfg.model.width >= 1, ">= 1"),
        ("model.depth", 1 <= cfg.model.depth <= 64, "between 1 and 64"),
        ("model.dropout", 0 <= cfg.model.dropout < 1, "in [0, 1)"),
        ("run.log_every", cfg.run.log_every >= 1, ">= 1"),
        ("run.threads", cfg.run.threads >= 0, ">= 1, or 0 for auto"),
        # torch seeds are 64-bit; ranks add their rank and the sampler its epoch to the seed.
        ("run.seed", 0 <= cfg.run.seed < 2**63, "between 0 and 2**63 - 1"),
        ("run.name", _is_plain_name(cfg.run.name), "a folder name (letters, digits, - _ .)"),
    ]
    for key, ok, rule in checks:
        if not ok:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            raise ConfigError(f"{key} must be {rule}, got {value!r}")
    natural = BEST_MODES[cfg.train.best_metric]
    if cfg.train.best_mode not in ("auto", natural):
        raise ConfigError(
            f"train.best_mode={cfg.train.best_mode} would keep the worst {cfg.train.best_metric} "
            f"as best.pt; use train.best_mode={natural} or auto"
        )
    device = cfg.run.device
    if not (device in ("auto", "cpu", "cuda", "mps") or _is_cuda_index(device)):
        raise ConfigError(f"run.device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")


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


def _read_file(path: Path, seen: tuple, named_by: str = "the path given to --config") -> dict:
    """Read a YAML config; `extends: other.yaml` (relative to this file) is read first."""
    name = str(path)
    if not path.is_file():
        raise ConfigError(f"config file {name!r} not found (check {named_by})")
    if path.resolve() in seen:
        raise ConfigError(f"config file {name!r} extends itself in a loop")
    raw = path.read_bytes()
    if b"\0" in raw:
        raise ConfigError(f"config file {name!r} is binary, not YAML text; pass a .yaml file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {name!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); save it with UTF-8 encoding"
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except RecursionError:  # PyYAML recurses once per nesting level
        raise ConfigError(
            f"config file {name!r} is nested too deeply to read; a config holds sections of "
            "key: value lines"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {name!r}{where} is not valid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {name!r} must hold a mapping of sections")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip() or "\0" in base:
        raise ConfigError(
            f"config file {name!r}: extends must be the path of another config file, "
            f"e.g. extends: ../default.yaml; got {_short(repr(base))}"
        )
    parent = _read_file(path.parent / base, (*seen, path.resolve()), f"extends: in {name}")
    return _merge(parent, data)


def _parse_value(item: str, raw: str) -> Any:
    """The value of a `key=value` override, read as YAML: 3 -> int, true -> bool, [1] -> list."""
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError) as exc:
        problem = getattr(exc, "problem", None) or "nested too deeply"
        raise ConfigError(
            f"override {_short(item)!r}: cannot read the value ({problem}); write a number, "
            "true/false or plain text, and quote text that starts with [ { ! & * or a quote"
        ) from None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def closest(word: str, choices: typing.Iterable[str]) -> str | None:
    """The choice nearest to `word` ignoring case (MLP -> mlp), or None when none is close."""
    lower = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(word.lower(), lower, n=1, cutoff=0.6)
    return lower[match[0]] if match else None


def _unknown_key(cls, prefix: str, key: str, value: Any) -> str:
    """The error for a key that `cls` lacks, with the closest valid key. The section and the
    key are matched apart: `trian.epochs` gets section train, then the key epochs within it."""
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
    keys = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            keys += _all_keys(hint, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _build(cls, data: Any, prefix: str):
    if data is None and prefix:  # a section whose lines are all commented out
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a section (key: value lines)")
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
            values[name] = _coerce(data[name], hint, prefix + name)
    return cls(**values)


_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Return `value` as type `hint` or raise a ConfigError naming key, type and value."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool):  # YAML 1.1 reads off/no/on/yes as booleans
            value = next((c for c in _BOOL_WORDS[value] if c in choices), value)
        if value in choices:
            return value
        guess = closest(value, choices) if isinstance(value, str) else None
        tip = f" (did you mean '{guess}'?)" if guess else ""
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}{tip}")
    if typing.get_origin(hint) is list:
        return _coerce_list(value, typing.get_args(hint)[0], key)
    ok = False
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{key} must fit in 64 bits, got {_short(str(value))}")
    elif hint is float:
        if isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(value, int) and abs(value) >= 2**1023:
            value = math.inf if value > 0 else -math.inf  # beyond float range: 1e400
        elif ok:
            value = float(value)
    elif hint is str:
        value = "" if value is None else value  # `key=` with nothing after it
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        value = str(value) if ok else value
        if ok and "\0" in value:  # the OS refuses such paths and names
            raise ConfigError(f"{key} contains a NUL character: {_short(repr(value))}")
    if not ok:
        raise ConfigError(f"{key} expects {hint.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _coerce_list(value: Any, item: Any, key: str) -> list:
    """A list setting: a YAML list, or text split at commas (`run.loggers=csv,wandb` needs no
    brackets, which shells expand); each item checked as `item`, repeats dropped."""
    if value is None:
        value = []
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise ConfigError(
            f"{key} expects a list such as [a, b] or a,b; got {_short(repr(value))} "
            f"({type(value).__name__})"
        )
    items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    return list(dict.fromkeys(items))
