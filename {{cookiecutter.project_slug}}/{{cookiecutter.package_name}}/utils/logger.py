"""Metric logging: a CSV row per epoch, TensorBoard scalars per log step, one summary per run.

Only rank 0 creates a logger; the others get a disabled one, so callers never branch on rank.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import time
from pathlib import Path


class MetricLogger:
    def __init__(self, run_dir: Path | None, tensorboard: bool = True, start_step: int = 0):
        self.run_dir = run_dir
        self.tensorboard = tensorboard and run_dir is not None
        self.start_step = start_step
        self._writer = None
        if run_dir is not None:
            # Found now, before an epoch's work, rather than when the first row is due.
            for path in (run_dir / "metrics.csv", run_dir.parent / "runs.csv"):
                if path.is_dir():
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))

    @property
    def enabled(self) -> bool:
        return self.run_dir is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Step-level curves (loss, lr, grad norm) for TensorBoard."""
        if not self.tensorboard:
            return
        if self._writer is None:
            # Imported on first use: TensorBoard costs ~1 s of import time at start-up.
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a crashed run wrote after the checkpoint we resumed from.
            purge = self.start_step or None
            self._writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge)
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def epoch(self, row: dict[str, float]) -> None:
        """Append one row to metrics.csv (written header-first, appended on resume)."""
        if not self.enabled:
            return
        self.scalars(int(row["step"]), {k: v for k, v in row.items() if "/" in k})
        _append_csv(self.run_dir / "metrics.csv", row)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def append_run_summary(output_dir: Path, row: dict) -> None:
    """One line per finished run in <output_dir>/runs.csv: the experiment table (seed §6.3)."""
    _append_csv(output_dir / "runs.csv", {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), **row})


def _append_csv(path: Path, row: dict) -> None:
    """Append a row; the header is written with the first one. A write that fails (a full
    disk, a file-size limit) is cut off again, so the file never ends in half a row."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(row))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        if start == 0:
            writer.writeheader()
        writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
        data = text.getvalue().encode()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
