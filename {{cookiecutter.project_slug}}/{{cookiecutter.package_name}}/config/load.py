"""Loading: defaults < config file (after the files it `extends`) < `key=value` overrides, each
key and value checked as it is built; writing back a resolved config."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from ..errors import LEFT_OUT, ConfigError, left_out, unused
from ..utils.locks import replace_text
from .schema import (
    COMPONENTS,
    SECTIONS,
    Config,
    DataConfig,
    ModelConfig,
    NoOptions,
    TaskConfig,
    components,
    options_type,
)
from .text import RENAMED, closest, coerce, parse_value, read_file, unknown_key
from .validate import validate


def load_config(
    path: str | Path | None = None, overrides: typing.Sequence[str] = (), base: dict | None = None
) -> Config:
    """Defaults, then the file at `path` (or the dict `base`, e.g. a checkpoint's config),
    then `key=value` overrides; validated."""
    data: dict = file_settings(path) if path else _merge({}, base or {})
    # All overrides form one layer, so their order does not matter: model.width=8
    # model.name=mlp sets the mlp's width (a component's options from the layers below are
    # dropped when a layer chooses another component). A section's value, train={epochs: 3},
    # merges key by key as a config file's section does (it replaced train.lr=... before it).
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
        node[leaf] = _combine(node.get(leaf), parse_value(item, raw))
    cfg = from_dict(_merge(data, top))
    validate(cfg)
    return cfg


def file_settings(path: str | Path) -> dict:
    """What the config file at `path` sets, the files it `extends` laid under it: the layer
    load_config puts over the defaults. ConfigError when a file does not read."""
    return read_file(Path(path), _merge)


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


def save_config(cfg: Config | dict, path: Path) -> None:
    """Written whole or not at all: a full disk never leaves half a config. `cfg`: a Config,
    or its to_dict()."""
    settings = cfg if isinstance(cfg, dict) else to_dict(cfg)
    replace_text(path, yaml.safe_dump(settings, sort_keys=False))


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(_common_only(key, out[key], value), value)
        else:
            out[key] = value
    return out


def _combine(base: Any, top: Any) -> Any:
    """Two values of one layer: sections merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{key: _combine(base.get(key), value) for key, value in top.items()}}
    return top


def _common_only(section: str, base: dict, top: dict) -> dict:
    """`base` without its component options when `top` chooses another component: a file
    extending default.yaml with data.name=csv must not inherit the synthetic data's sizes."""
    if section not in COMPONENTS or "name" not in top:
        return base
    if top["name"] == base.get("name", SECTIONS[section].name):
        return base
    common = {f.name for f in dataclasses.fields(SECTIONS[section])}
    return {k: v for k, v in base.items() if k in common}


def _all_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every key of the config, the default components' options included."""
    keys = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            keys += _all_keys(hint, f"{prefix}{f.name}.")
        elif f.name == "options":
            section = prefix.rstrip(".")
            keys += _all_keys(options_type(section, SECTIONS[section].name), prefix)
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
        # A key of a project generated with more options (errors.LEFT_OUT) that holds the
        # value meaning "not used" there (errors.UNUSED): its config or checkpoint loads here.
        if key not in known and not unused(f"{prefix}{key}", data[key]):
            raise ConfigError(unknown_key(cls, prefix, str(key), data[key], _all_keys))
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
            raise ConfigError(unknown_key(cls, prefix, str(key), data[key], _all_keys))
        if key in common | own or unused(f"{section}.{key}", data[key]):
            continue  # unused: a fuller project's option that its run did not use
        if f"{section}.{key}" in LEFT_OUT:
            raise ConfigError(left_out(f"{section}.{key}", f"config key '{section}.{key}'"))
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
