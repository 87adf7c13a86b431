"""Errors a user can fix. The scripts print these as one line and exit non-zero."""


class UserError(Exception):
    """Bad input (a config value, a path, a checkpoint); the message names problem and fix."""


class ConfigError(UserError):
    """A config file, key or value that cannot be used."""


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt, unsafe or does not fit the model."""
