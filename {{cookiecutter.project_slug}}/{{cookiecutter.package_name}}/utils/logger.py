"""Metric logging: a CSV row per epoch (and curves.png drawn from it), TensorBoard scalars and
the experiment trackers of run.loggers per log step, one row per run.

Only rank 0 creates a logger; the others get a disabled one, so callers never branch on rank.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import locks, run_files
from .metrics import flatten
from .plots import INSTALL_HINT, available, plot_curves
from .trackers import open_trackers

# curves.png is redrawn at an epoch's end once REDRAW_EVERY_S has passed since the last
# drawing, and the drawing (~1 s on a CPU for a classification's 8 panels) at most
# REDRAW_SHARE of the time since: the interval grows with its cost. It is drawn when the run
# ends if it trained at least DRAW_AT_END_AFTER_S (a first drawing also imports matplotlib,
# ~1 s: the tail of every tiny run, test and trial). A shorter run's curves are in
# metrics.csv and TensorBoard, and `scripts/compare_runs.py <run folder>` draws them.
REDRAW_EVERY_S = 30.0
REDRAW_SHARE = 0.01
DRAW_AT_END_AFTER_S = 30.0
# The last step given to the trackers, beside the checkpoints: a resume from an earlier step
# finds out that they hold steps it will log again.
TRACKED_STEP = run_files.TRACKED_STEP
# What a damaged record raises when read: a cell that is not a number, bytes that are not
# UTF-8 (UnicodeDecodeError is a ValueError), a NUL byte or a broken quote (csv.Error).
DAMAGED = (ValueError, csv.Error)


class MetricLogger:
    def __init__(
        self,
        run_dir: Path | None,
        loggers: Sequence[str] = ("csv", "tensorboard"),
        start_step: int = 0,
        config: dict | None = None,
        tracker_ids: dict | None = None,
        lost: Callable[[], str | None] | None = None,
    ):
        """`loggers`: run.loggers; metrics.csv is written whatever it holds (resume, the
        plots and compare_runs read it). `start_step`: the step the run (re)starts
        from. What an earlier attempt logged after it (a crash after the checkpoint, a corrupt
        newest checkpoint) is dropped, so curves and metrics.csv hold one value per step.
        `config` is logged to the trackers; `tracker_ids` (from the checkpoint) resumes
        their runs. `lost()` (the run folder's, checkpoint/run_folder.py) says why the run no
        longer holds run_dir: from then on nothing more is written there (see _holds)."""
        self.run_dir = run_dir
        self._lost, self._gone = lost, False
        self.tensorboard = "tensorboard" in loggers and run_dir is not None
        self.start_step = start_step
        self._writer = None
        self.trackers: list = []
        self.curves = False  # curves.png, redrawn from metrics.csv (when matplotlib is there)
        self._opened, self._elapsed = time.perf_counter(), 0.0
        self._drawn_at, self._stale = self._opened, False  # curves.png vs metrics.csv
        self._redraw_s = REDRAW_EVERY_S  # grows with the drawing's cost (REDRAW_SHARE)
        if run_dir is not None:
            # Found now, before an epoch's work, rather than when the first row is due.
            for path in (run_dir / run_files.METRICS, run_dir.parent / run_files.RUNS):
                if path.is_dir():
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            # Wall time continues across resumes (the time between attempts is not counted).
            self._elapsed = _rewind(run_dir / run_files.METRICS, start_step)
            self.curves = available()
            if not self.curves:
                print(f"note: no curves.png without matplotlib; to draw it: {INSTALL_HINT}")
            self.trackers = open_trackers(
                loggers, run_dir, config or {}, *_rewound(run_dir, tracker_ids or {}, start_step)
            )

    @property
    def enabled(self) -> bool:
        return self.run_dir is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Step-level curves (loss, lr, grad norm) for TensorBoard and the trackers; a vector
        value is logged per entry (`<name>/<index>`: TensorBoard takes scalars only)."""
        values = flatten(values)
        if self.trackers:  # noted first: a crash right after the log still counts it
            if not self._holds():
                return  # and the trackers get no step that .tracked_step would not count
            locks.replace_text(self.run_dir / TRACKED_STEP, str(step), durable=False)
        for tracker in self.trackers:
            tracker.log(values, step)
        if not self.tensorboard:
            return
        if self._writer is None:
            if not self._holds():
                return
            # Imported on first use: TensorBoard costs ~1 s of import time at start-up.
            from torch.utils.tensorboard import SummaryWriter

            # Hides events an earlier attempt wrote at steps after the one resumed from.
            purge = self.start_step + 1
            board = self.run_dir / run_files.TRACKER_FOLDERS[0]  # tb/
            self._writer = SummaryWriter(str(board), purge_step=purge)
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def epoch(self, row: dict[str, float]) -> None:
        """Append one row to metrics.csv (written header-first, appended on resume), with
        the wall time since the run started; redraw curves.png if REDRAW_EVERY_S passed."""
        if not self.enabled:  # the row is written inside RunFolder.save, after its check
            return
        elapsed = self._elapsed + time.perf_counter() - self._opened
        row = {**flatten(row), "time/elapsed_s": elapsed}
        self.scalars(int(row["step"]), {k: v for k, v in row.items() if "/" in k})
        _append_csv(self.run_dir / run_files.METRICS, row)
        self._stale = True
        if time.perf_counter() - self._drawn_at >= self._redraw_s:
            self._draw_curves()

    def tracker_ids(self) -> dict[str, str]:
        """{tracker: run id}, saved in checkpoints so that a resume continues those runs."""
        return {tracker.name: tracker.id for tracker in self.trackers}

    def _holds(self) -> bool:
        """Whether the run still holds run_dir. Asked only before a file is written by its
        path (the writes to open files, TensorBoard's events, land in the folder the run
        locked, wherever it went), so a run without trackers pays no check per step."""
        self._gone = self._gone or bool(self._lost and self._lost())
        return not self._gone

    def _draw_curves(self) -> None:
        if not (self.curves and self._stale and self._holds()):
            return
        start = time.perf_counter()
        try:
            plot_curves(self.run_dir / run_files.METRICS, self.run_dir / run_files.CURVES)
        except Exception as exc:  # a plot is never worth a training run: note it, go on
            print(f"warning: curves.png not drawn ({type(exc).__name__}: {exc}); no more tries")
            self.curves = False
        self._drawn_at, self._stale = time.perf_counter(), False
        self._redraw_s = max(REDRAW_EVERY_S, (self._drawn_at - start) / REDRAW_SHARE)

    def close(self) -> None:
        if time.perf_counter() - self._opened >= DRAW_AT_END_AFTER_S:
            self._draw_curves()  # the epochs since the last drawing
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as exc:  # runs in train()'s finally: never hide the run's error
                print(f"warning: {tracker.name} did not close cleanly: {exc}")


def _rewound(run_dir: Path, ids: dict, step: int) -> tuple[dict, dict | None]:
    """The tracker runs to continue, and what a new one branches from. A tracker cannot drop
    what was logged after the checkpoint resumed from (one would drop the replayed steps,
    another keep two values per step), so a resume after such steps logs to new tracker runs
    (same name), each noting the run and step it continues."""
    try:
        logged = int((run_dir / TRACKED_STEP).read_text())
    except (FileNotFoundError, ValueError):
        logged = step
    if not ids or logged <= step:
        return ids, None
    print(
        f"note: the tracker runs {ids} hold steps up to {logged}, past the checkpoint's "
        f"{step}; logging the resume to new tracker runs (same name), so each step is once"
    )
    return {}, {"runs": ids, "step": step}


def record_run(output_dir: Path, row: dict) -> None:
    """The run's line in <output_dir>/runs.csv, the table of experiments: one row
    per run, replaced when the run is extended, under one header (the union of all rows')."""
    path = output_dir / run_files.RUNS
    row = {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), **row}
    # A lock file opened for writing: NFS emulates flock with fcntl locks, and an exclusive
    # one needs a writable descriptor (a folder's, or one opened read-only, gets EBADF).
    lock = output_dir / run_files.RUNS_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # Serialises runs.csv updates of runs that end at the same time.
        locks.lock(fd, lock, "two runs ending at once could lose a row of runs.csv")
        try:
            rows = [r for r in _read_csv(path) if r.get("run") != str(row["run"])]
        except DAMAGED as exc:  # the run's own result counts more than the old table
            _set_aside(path, exc)
            rows = []
        rows.append(_formatted(flatten(row)))
        header = list(dict.fromkeys(key for r in rows for key in r))
        _write_csv(path, header, rows)
    finally:
        os.close(fd)  # releases the lock


def human_count(n: int) -> str:
    """A count as people read it: 1603 -> 1.6k, 2_300_000 -> 2.3M, 1_200_000_000 -> 1.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= 1000 and round(n / scale, 1) >= 1:  # 999,950 is 1.0M, not 1000.0k
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def _append_csv(path: Path, row: dict) -> None:
    """Append a row; the header is written with the first one. A write that fails (a full
    disk, a file-size limit) is cut off again, so the file never ends in half a row. A row
    with other columns than the file's (a run resumed on another device logs another memory
    column) rewrites the file with every column, so no value lands under a wrong header."""
    header = _header(path)
    if header and header != list(row):
        rows = [*_read_csv(path), _formatted(row)]
        _write_csv(path, list(dict.fromkeys([*header, *row])), rows)
        return
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(row))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        if start == 0:
            writer.writeheader()
        writer.writerow(_formatted(row))
        data = text.getvalue().encode()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _rewind(path: Path, step: int) -> float:
    """Drop the rows of metrics.csv logged after `step`; returns the wall time they reached.
    A file that cannot be read is set aside: the checkpoints, not the record, hold the run."""
    try:
        kept = _drop_rows_after(path, step)
        return float(kept[-1].get("time/elapsed_s") or 0) if kept else 0.0
    except DAMAGED as exc:
        _set_aside(path, exc)
        return 0.0


def _set_aside(path: Path, exc: Exception) -> None:
    """Rename `path` to <name>.damaged, or .damaged.2, .3 ... where an earlier one is kept:
    each damaged record stays for a look, none replaces another."""
    damaged, n = path.with_name(f"{path.name}.damaged"), 1  # run_files.DAMAGED
    while damaged.exists():
        n += 1
        damaged = path.with_name(f"{path.name}.damaged.{n}")
    os.replace(path, damaged)
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
    print(f"warning: {path} is damaged ({reason}); set aside as {damaged.name}, a new one starts")


def _drop_rows_after(path: Path, step: int) -> list[dict]:
    """Drop the rows logged after `step`; returns the rows kept."""
    rows = _read_csv(path)
    kept = [row for row in rows if int(float(row.get("step") or 0)) <= step]
    if len(kept) < len(rows):
        _write_csv(path, list(rows[0]), kept)
    return kept


def _header(path: Path) -> list[str]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path: Path, header: list[str], rows: list[dict]) -> None:
    """Rewritten whole: a crash leaves the old file or the new."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=header, restval="")
    writer.writeheader()
    writer.writerows(rows)
    locks.replace_text(path, text.getvalue())


def _formatted(row: dict) -> dict:
    return {k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()}
