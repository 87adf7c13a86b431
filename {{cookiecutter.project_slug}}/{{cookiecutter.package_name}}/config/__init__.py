"""Typed configuration: YAML files and `key=value` overrides on top of dataclass defaults.

Precedence, later wins: dataclass defaults < config file (after the files it `extends`) <
command-line overrides. `configs/default.yaml` mirrors the defaults of schema.py (a test keeps
the two equal); experiment files start with `extends: ../default.yaml` and hold only what
changes.

The package: schema.py (the dataclasses and their defaults), text.py (reading YAML and
override values, typed values, "did you mean" for unknown and renamed keys), load.py (the
layers and building the settings from them) and validate.py (the rules between values).
"""

from .load import file_settings, flatten, from_dict, load_config, save_config, to_dict
from .schema import (
    COMPONENTS,
    SECTIONS,
    Config,
    DataConfig,
    ModelConfig,
    NoOptions,
    RunConfig,
    TaskConfig,
    TrainConfig,
    components,
    options_type,
)
from .text import closest
from .validate import validate

__all__ = [
    "COMPONENTS",
    "SECTIONS",
    "Config",
    "DataConfig",
    "ModelConfig",
    "NoOptions",
    "RunConfig",
    "TaskConfig",
    "TrainConfig",
    "closest",
    "components",
    "file_settings",
    "flatten",
    "from_dict",
    "load_config",
    "options_type",
    "save_config",
    "to_dict",
    "validate",
]
