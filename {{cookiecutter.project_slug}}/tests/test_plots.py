"""curves.png: redrawn from metrics.csv at epoch ends and at the end of a run long enough
for a drawing to be a small share of it, whatever validation metrics the task logs;
matplotlib is optional and training goes on without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import logger, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_folder(tiny) -> Path:
    cfg = load_config(None, tiny)
    return Path(cfg.run.output_dir) / cfg.run.name


def write_metrics(path: Path, header: str, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.fixture
def drawings(monkeypatch) -> list[tuple[int, int]]:
    """(rows of metrics.csv, lines drawn) of each drawing of curves.png during training."""
    pytest.importorskip("matplotlib", reason="plots are optional: pip install -e '.[plots]'")
    drawn = []

    def spy(metrics_csv, out):
        lines = plots.plot_curves(metrics_csv, out)
        drawn.append((len(metrics_csv.read_text().splitlines()) - 1, lines))
        return lines

    monkeypatch.setattr(logger, "plot_curves", spy)
    return drawn


@pytest.mark.slow
def test_training_redraws_curves_png_at_each_epoch_end(tiny, monkeypatch, drawings):
    monkeypatch.setattr(logger, "REDRAW_EVERY_S", 0)  # as when epochs are long
    monkeypatch.setattr(logger, "REDRAW_SHARE", float("inf"))  # and drawings short beside them
    fit(load_config(None, tiny))  # 2 epochs
    # After each epoch, from every row so far: train+val loss, val/acc, macro_f1,
    # balanced_acc, lr, and a line per class (4) in each of precision, recall and f1's panels.
    assert drawings == [(1, 18), (2, 18)]
    png = run_folder(tiny) / "curves.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert height > 100 and width > 100
    assert not list(png.parent.glob(".curves.png.tmp*"))  # written through a rename


@pytest.mark.slow
def test_a_drawing_waits_until_it_is_a_small_share_of_the_run(tiny, monkeypatch, drawings):
    """A drawing costs about a second on a CPU: the next waits until it is REDRAW_SHARE of
    the time since (here a millionth: never again in this run), not every REDRAW_EVERY_S."""
    monkeypatch.setattr(logger, "REDRAW_EVERY_S", 0)
    monkeypatch.setattr(logger, "REDRAW_SHARE", 1e-6)
    fit(load_config(None, tiny))  # 2 epochs
    assert drawings == [(1, 18)]


@pytest.mark.slow
def test_short_epochs_are_drawn_once_when_the_run_ends(tiny, drawings, monkeypatch):
    monkeypatch.setattr(logger, "DRAW_AT_END_AFTER_S", 0)  # as when the run took 30 s
    fit(load_config(None, [*tiny, "train.epochs=3"]))
    assert drawings == [(3, 18)]


def test_a_run_shorter_than_a_drawing_is_worth_draws_no_curves(tiny, drawings, capsys):
    """A tiny run (a test, a smoke run, a trial) does not spend ~1 s of matplotlib on
    curves.png; its metrics.csv holds them and the summary's compare command draws them."""
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    assert drawings == [] and not (run_folder(tiny) / "curves.png").exists()
    assert "compare: python scripts/compare_runs.py" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("header", "lines"),
    [
        # regression: a panel per metric, none of them acc
        ("epoch,step,train/epoch_loss,val/loss,val/mae,val/rmse,val/r2,lr", 2 + 3 + 1),
        # per-step train/loss and train/lr preferred when present
        ("epoch,step,train/loss,train/lr,val/loss,val/acc,lr", 2 + 1 + 1),
        # no validation loss: the loss panel holds the training loss alone
        ("epoch,step,train/epoch_loss,val/acc,lr", 1 + 1 + 1),
    ],
)
def test_curves_plot_whatever_metrics_the_csv_holds(tmp_path, header, lines):
    pytest.importorskip("matplotlib", reason="plots are optional: pip install -e '.[plots]'")
    columns = header.count(",") + 1
    rows = [",".join(str(step * 0.1 + i) for i in range(columns)) for step in (4, 8)]
    rows = [f"{n},{n * 4},{row.split(',', 2)[2]}" for n, row in enumerate(rows, 1)]
    csv = write_metrics(tmp_path / "run" / "metrics.csv", header, rows)
    out = tmp_path / "run" / "curves.png"
    assert plots.plot_curves(csv, out) == lines
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_curves_read_a_column_added_on_resume_as_a_gap(tmp_path):
    csv = write_metrics(tmp_path / "metrics.csv", "step,val/loss", ["4,1.0", "8,0.5,9"])
    columns = plots.read_columns(csv)
    assert columns["step"] == [4.0, 8.0] and columns["val/loss"] == [1.0, 0.5]


@pytest.mark.slow
def test_training_without_matplotlib_trains_and_says_how_to_install_it(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a missing package looks like
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    result = fit(load_config(None, tiny))
    assert result["epoch"] == 2
    notes = [line for line in capsys.readouterr().out.splitlines() if "matplotlib" in line]
    assert notes == [
        "note: no curves.png without matplotlib; to draw it: pip install -e '.[plots]'"
    ]
    run = run_folder(tiny)
    assert (run / "metrics.csv").is_file() and not (run / "curves.png").exists()


def test_a_vector_metric_s_entries_share_one_panel():
    columns = ["step", "val/loss", "val/acc", "val/f1/cat", "val/f1/dog", "val/recall/cat", "lr"]
    panels = plots.curve_panels(dict.fromkeys(columns, [1.0]))
    assert panels == {
        "loss": ["val/loss"],
        "val/acc": ["val/acc"],
        "val/f1": ["val/f1/cat", "val/f1/dog"],
        "val/recall": ["val/recall/cat"],
        "learning rate": ["lr"],
    }
