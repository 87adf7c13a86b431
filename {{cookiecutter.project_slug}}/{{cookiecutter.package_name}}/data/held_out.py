"""Rows other than the training run's: the checks that keep evaluation on the validation and
test splits a checkpoint recorded, and the one line that says where other rows are scored."""

from __future__ import annotations

from ..errors import ConfigError

# Where evaluation of other rows is meant to go: docs/data.md's "Splits and training order".
OTHER_ROWS = (
    "evaluate on the same data; score another labelled table with evaluate.py --data FILE, "
    "or the run's data.test_path with --split test"
)


def check_own_val(samples: int, meta: dict | None) -> None:
    """Refuse to evaluate a validation table (data.val_path) or val folder other than the
    checkpoint's: one that held out rows of its pool then, or one of another size."""
    meta = meta or {}
    then = meta["split"]["val"] if meta.get("split") else meta.get("val_samples")
    if then is not None and then != samples:
        raise ConfigError(
            f"the validation split differs from the training run's ({samples} samples now, "
            f"{then} then): data.val_path or the data changed; {OTHER_ROWS}"
        )
    if meta.get("split"):
        raise ConfigError(
            "the training run held out data.val_fraction of its data for validation, and "
            f"this config gives a validation table or folder of its own; {OTHER_ROWS}"
        )


def check_test_split(test, meta: dict | None) -> None:
    """Refuse a test split of another size than the one a checkpoint's `meta` recorded."""
    saved = (meta or {}).get("test")
    if saved and saved.get("samples") != len(test):
        raise ConfigError(
            f"the test split has {len(test)} samples, the training run's had "
            f"{saved['samples']} ({saved.get('path')}): the test data changed; score another "
            "labelled file with evaluate.py --data FILE"
        )
