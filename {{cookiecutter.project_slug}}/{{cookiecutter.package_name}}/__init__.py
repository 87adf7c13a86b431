"""Training code of this project: config, data, models, trainer, checkpoints, distributed."""

__version__ = "0.1.0"
