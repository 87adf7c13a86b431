"""Config text, before it knows any section: YAML files (with `extends:`), the values of
`key=value` overrides, and values checked against their declared types, each problem one
ConfigError line naming the key, the file or the value; "did you mean" for unknown and
renamed keys. load.py builds the settings."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from ..errors import LEFT_OUT, ConfigError, left_out


def read_file(
    path: Path, merge, seen: tuple = (), named_by: str = "the path given to --config"
) -> dict:
    """Read a YAML config; `extends: other.yaml` (relative to this file) is read first and
    `merge(parent, this)` lays this file over it."""
    name = str(path)
    if not path.exists():
        raise ConfigError(f"config file {name!r} not found (check {named_by})")
    if not path.is_file():  # /dev/zero, a FIFO, a folder: reading would block or never end
        raise ConfigError(f"config file {name!r} is not a regular file; give a .yaml file")
    if path.resolve() in seen:
        raise ConfigError(f"config file {name!r} extends itself in a loop")
    raw = path.read_bytes()
    if len(raw) > MAX_BYTES:  # before parsing: PyYAML reads ~60 KB of values a second
        raise ConfigError(
            f"config file {name!r} is {len(raw) / 2**20:.1f} MB, over the {MAX_BYTES // 1024} KB "
            "a config may be; a config holds settings (a few KB): put data in data files"
        )
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
        data = load_yaml(text, f"config file {name!r}") or {}
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
            f"e.g. extends: ../default.yaml; got {short(repr(base))}"
        )
    parent = read_file(path.parent / base, merge, (*seen, path.resolve()), f"extends: in {name}")
    return merge(parent, data)


def parse_value(item: str, raw: str) -> Any:
    """The value of a `key=value` override, read as YAML: 3 -> int, true -> bool, [1] -> list."""
    if not raw.strip():
        return ""
    try:
        return load_yaml(raw, f"override {short(item)!r}")
    except (yaml.YAMLError, RecursionError) as exc:
        problem = getattr(exc, "problem", None) or "nested too deeply"
        raise ConfigError(
            f"override {short(item)!r}: cannot read the value ({problem}); write a number, "
            "true/false or plain text, and quote text that starts with [ { ! & * or a quote"
        ) from None


# Nodes a document may hold once its aliases are expanded. A config is a few hundred; an alias
# bomb (billion laughs: 9 aliases of 9 aliases of ...) fits a billion in 500 bytes, and
# whatever walks the result (merging, checking, printing it in a message) would take hours.
MAX_NODES = 100_000
MAX_BYTES = 256 * 1024  # a config file's size: the demo configs are under 2 KB


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader for settings: a mapping's keys are the text written (`{no: 1, yes: 9}`
    has "no" and "yes", not YAML 1.1's False and True), a key given twice in one mapping is
    refused (YAML keeps the last silently: a second `train:` section drops the first's), and
    so is a document past MAX_NODES values once its aliases (*a) are expanded, counted as it
    is read: linear in the text however far the aliases would expand."""

    def __init__(self, text: str, what: str):
        super().__init__(text)
        self.what, self.expanded, self.sizes = what, 0, {}

    def compose_node(self, parent, index):
        alias, start = self.check_event(yaml.AliasEvent), self.expanded
        node = super().compose_node(parent, index)
        if alias:  # a node not finished yet holds itself (&a [*a]): endless
            self.expanded += self.sizes.get(id(node), MAX_NODES + 1)
        else:
            self.expanded += 1
            self.sizes[id(node)] = self.expanded - start
        if self.expanded > MAX_NODES:
            raise ConfigError(
                f"{self.what} holds over {MAX_NODES:,} values (an alias *name counts as the "
                "values it repeats); a config holds settings: put data in data files, and "
                "write values out instead of repeating anchors (&name)"
            )
        return node

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            if key.value in keys:
                line = key.start_mark.line + 1
                where = f" line {line}" if self.what.startswith("config file") else ""
                raise ConfigError(
                    f"{self.what}{where} gives the key {short(repr(key.value))} twice in one "
                    "mapping (YAML would keep the last, dropping the first one's settings); "
                    "write each key once"
                )
            keys.add(key.value)
            if key.tag in _NAMES:
                key.tag = "tag:yaml.org,2002:str"
        return super().construct_mapping(node, deep)


_NAMES = {f"tag:yaml.org,2002:{kind}" for kind in ("bool", "int", "float", "null")}


def load_yaml(text: str, what: str) -> Any:
    """yaml.safe_load with _Loader's three refusals, each one ConfigError line."""
    loader = _Loader(text, what)
    try:
        return loader.get_single_data()
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise ConfigError(f"{what} holds a value that cannot be read: {exc}") from None
    finally:
        loader.dispose()


def short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest(word: str, choices: typing.Iterable[str]) -> str | None:
    """The choice nearest to `word` ignoring case (MLP -> mlp), or None when none is close."""
    lower = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(word.lower(), lower, n=1, cutoff=0.6)
    return lower[match[0]] if match else None


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the choice nearest to `word`, or "" when none is close."""
    close = closest(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Return `value` as type `hint` or raise a ConfigError naming key, type and value."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool):  # YAML 1.1 reads off/no/on/yes as booleans
            value = next((c for c in _BOOL_WORDS[value] if c in choices), value)
        if value in choices:
            return value
        listed = re.sub(r"\[\d+\]$", "", key)  # run.loggers[1] is a value of run.loggers
        if f"{listed}={value}" in LEFT_OUT:  # a value of a project generated with more options
            raise ConfigError(left_out(f"{listed}={value}", f"{key}={value}"))
        guess = closest(value, choices) if isinstance(value, str) else None
        tip = f" (did you mean '{guess}'?)" if guess else ""
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}{tip}")
    if typing.get_origin(hint) is list:
        return coerce_list(value, typing.get_args(hint)[0], key)
    if typing.get_origin(hint) is dict:  # {name: value}, e.g. task.class_weights by class
        if not isinstance(value, dict):
            raise ConfigError(f"{key} expects a mapping (name: value); got {short(repr(value))}")
        key_type, value_type = typing.get_args(hint)
        return {
            coerce(k, key_type, f"{key}.{k}"): coerce(v, value_type, f"{key}.{k}")
            for k, v in value.items()
        }
    if typing.get_origin(hint) in (types.UnionType, typing.Union):  # the first type that fits
        arms = typing.get_args(hint)  # a Literal arm named by its value: "int or auto"
        for arm in arms:
            with contextlib.suppress(ConfigError):
                return coerce(value, arm, key)
        names = " or ".join(a.__args__[0] if hasattr(a, "__args__") else a.__name__ for a in arms)
        raise ConfigError(f"{key} expects {names}, got {short(repr(value))}")
    ok = False
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{key} must fit in 64 bits, got {short(str(value))}")
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
            raise ConfigError(f"{key} contains a NUL character: {short(repr(value))}")
    if not ok:
        raise ConfigError(f"{key} expects {hint.__name__}, got {value!r} ({type(value).__name__})")
    return value


def coerce_list(value: Any, item: Any, key: str) -> list:
    """A list setting: a YAML list, or text split at commas (`run.loggers=csv,tensorboard` needs no
    brackets, which shells expand); each item checked as `item`, repeated names dropped."""
    if value is None:
        value = []
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise ConfigError(
            f"{key} expects a list such as [a, b] or a,b; got {short(repr(value))} "
            f"({type(value).__name__})"
        )
    items = [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    # Repeated names mean nothing more (loggers, features); repeated numbers are values.
    return items if item in (int, float) else list(dict.fromkeys(items))


# Keys of earlier versions of this project, and what replaced them.
RENAMED = {
    "run.tensorboard": "run.loggers (a list: run.loggers=csv,tensorboard; false: run.loggers=csv)",
    "data.fold_seed": "data.split_seed (it seeds the validation split too)",
}


def unknown_key(cls, prefix: str, key: str, value: Any, every_key) -> str:
    """The error for a key that `cls` lacks, with the closest valid key (`every_key()`: all the
    config's keys). Section and key are matched apart: `trian.epochs` is train, then epochs."""
    if f"{prefix}{key}" in RENAMED:  # a config or checkpoint of an earlier version
        return f"config key '{prefix}{key}' is now {RENAMED[prefix + key]}"
    if f"{prefix}{key}" in LEFT_OUT:  # a key of a project generated with more options
        return left_out(f"{prefix}{key}", f"config key '{prefix}{key}'")
    hints = typing.get_type_hints(cls)
    name, guess = f"{prefix}{key}", closest(key, hints)
    if isinstance(value, dict) and value:  # a misspelt section: name its first key too
        inner = str(next(iter(value)))
        name += f".{inner}"
        if guess and dataclasses.is_dataclass(hints[guess]):
            sub = closest(inner, typing.get_type_hints(hints[guess]))
            guess = f"{guess}.{sub}" if sub else guess
    if guess is None:  # a key of one other section: train.seed -> run.seed, epochs -> train.epochs
        leaf = closest(key, {k.rpartition(".")[2] for k in every_key()})
        found = [k for k in every_key() if leaf and k.endswith(f".{leaf}")]
        guess = found[0] if len(found) == 1 else None
    else:
        guess = prefix + guess
    hint = f" (did you mean '{guess}'?)" if guess else ""
    return f"unknown config key '{name}'{hint}"
