"""scripts/export.py: each format loads back and matches the eager model; a broken artifact
or a model the format cannot follow fails with a non-zero exit and one line."""

from __future__ import annotations

import csv
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY
from torch import nn

from {{ cookiecutter.package_name }} import checkpoint, ema
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools import export, formats
from {{ cookiecutter.package_name }}.tools.export import export_main
from {{ cookiecutter.package_name }}.tools.inference import load_trained, validation_inputs
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import fit

# Each test but the torch floor's trains, then exports or checks parity: make test-all.

ONNX = ("onnx", "onnxscript", "onnxruntime")


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> str:
    """A tiny cnn (BatchNorm included) trained for one epoch on synthetic images."""
    out = tmp_path_factory.mktemp("export")
    fit(load_config(None, [*TINY, "train.epochs=1", f"run.output_dir={out}"]))
    return str(out / "default" / "best.pt")


def run_export(best: str, fmt: str, out: Path, *args: str) -> int:
    return export_main(["--checkpoint", best, "--format", fmt, "--out", str(out), *args])


@pytest.mark.slow
def test_a_run_with_weight_averaging_exports_the_average(tmp_path):
    """train.ema_decay: the artifact holds the averaged weights (which best.pt was chosen
    by), not the ones trained; its parity check ran against the averaged model."""
    cfg = [*TINY, "train.epochs=1", "train.ema_decay=0.9", f"run.output_dir={tmp_path}"]
    fit(load_config(None, cfg))
    best = tmp_path / "default" / "best.pt"
    out = tmp_path / "m.torchscript.pt"
    assert run_export(str(best), "torchscript", out) == 0
    state = checkpoint.load(best)
    average, trained = ema.weights(state["ema"]), state["model"]
    artifact = torch.jit.load(out).state_dict()
    key = next(k for k in average if k.endswith("weight") and average[k].dim() > 1)
    [found] = [v for k, v in artifact.items() if k.endswith(key)]
    assert torch.equal(found, average[key]) and not torch.equal(found, trained[key])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_each_format_loads_back_and_matches_the_model(best, fmt, tmp_path):
    if fmt == "onnx" and not all(importlib.util.find_spec(m) for m in ONNX):
        pytest.skip("needs the [export] extra: onnx, onnxscript, onnxruntime")
    out = tmp_path / f"model{export.SUFFIXES[fmt]}"
    assert run_export(best, fmt, out) == 0
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert meta["format"] == fmt and meta["task"] == "classification"
    assert meta["input_shape"] == ["batch", 3, 8, 8] and meta["input_dtype"] == "float32"
    assert meta["classes"] == [f"angle_{c}" for c in range(4)]
    assert meta["input"]["units"].startswith("the values of the training data's x")
    assert meta["output"]["classes"] == meta["classes"] and meta["files"] == [out.name]
    # What a serving team needs of the run's record: the same as the checkpoint's.
    record = checkpoint.load(best)["meta"]["record"]
    assert meta["trained_from"]["config_sha256"] == record["config_sha256"]
    assert meta["trained_from"]["commit"] == record["code"]["commit"]
    assert meta["trained_from"]["data"] == record["data"]  # none: synthetic data
    parity = meta["parity"]
    assert parity["passed"] and parity["inputs"] == "validation" and parity["samples"] == 64
    # Another batch size than the one exported with: the batch dimension is dynamic.
    trained = load_trained(best)
    x = validation_inputs(trained, 5)
    with torch.no_grad():
        got, expected = export.run_artifact(fmt, out, x), trained.model(x)
    assert got.shape == (5, 4) and torch.allclose(got, expected, atol=1e-4)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_failed_parity_check_keeps_the_previous_artifact(best, tmp_path, monkeypatch, capsys):
    out = tmp_path / "model.pt"
    assert run_export(best, "torchscript", out) == 0
    before = snapshot(tmp_path)
    original = export.EXPORTERS["torchscript"]

    def export_then_corrupt(model, example, path):
        original(model, example, path)
        artifact = torch.jit.load(str(path))
        with torch.no_grad():
            next(artifact.parameters()).add_(0.5)  # as if a weight were saved wrong
        torch.jit.save(artifact, str(path))

    monkeypatch.setitem(export.EXPORTERS, "torchscript", export_then_corrupt)
    capsys.readouterr()
    assert run_export(best, "torchscript", out) == 1
    err = capsys.readouterr().err
    assert "FAILED parity: max abs difference" in err and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before  # the good artifact and its JSON, nothing left over
    # A tolerance as loose as the damage lets it pass: the check is against --atol.
    assert run_export(best, "torchscript", out, "--atol", "1e6") == 0
    assert json.loads((tmp_path / "model.pt.json").read_text())["parity"]["atol"] == 1e6


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_artifact(best, tmp_path, monkeypatch, capsys):
    out = tmp_path / "model.pt"
    assert run_export(best, "torchscript", out) == 0
    before = snapshot(tmp_path)

    def full(fd):  # the data is written, the disk refuses it at fsync (as delayed allocation)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    capsys.readouterr()
    assert run_export(best, "torchscript", out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {str(out)!r}: No space left on device")
    assert "unchanged); free space on that disk or choose another --out" in err
    assert len(err.splitlines()) == 1 and snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_file_size_limit_keeps_the_previous_artifact(best, tmp_path):
    """torch's own writers abort from C++ past the limit, leaving a truncated artifact."""
    import resource

    out = tmp_path / "model.pt"
    assert run_export(best, "torchscript", out) == 0
    before = snapshot(tmp_path)
    assert len(before["model.pt"]) > 16384

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    argv = ["--checkpoint", best, "--format", "torchscript", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export.py"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: cannot write {str(out)!r}: File too large")
    assert "ulimit -f" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_an_out_that_is_a_folder_is_named_not_blamed_on_the_model(best, tmp_path, capsys):
    assert run_export(best, "onnx", tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {str(tmp_path)!r} is a folder; give a file name")
    assert "try --format" not in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("error", [errno.EACCES, errno.EROFS])
def test_an_unwritable_out_is_named_not_blamed_on_the_model(
    best, tmp_path, monkeypatch, capsys, error
):
    # Made by refusing the first file-system write: the tests may run as root, which chmod
    # does not stop.
    def refuse(path, *args, **kwargs):
        raise OSError(error, os.strerror(error), str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    out = tmp_path / "model.pt"
    assert run_export(best, "torchscript", out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {str(out)!r}: {os.strerror(error)}; choose a")
    assert "--out" in err and "try --format" not in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("atol", ["nan", "-1"])
def test_a_tolerance_that_is_not_one_is_refused_before_anything_runs(
    best, tmp_path, monkeypatch, capsys, atol
):
    monkeypatch.setattr(export, "load_trained", lambda *args: pytest.fail("it ran"))
    assert run_export(best, "torchscript", tmp_path / "m.pt", "--atol", atol) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --atol {float(atol)} is not a tolerance; give a number >= 0")
    assert list(tmp_path.iterdir()) == []


class ValueBranch(nn.Module):
    """A model whose Python control flow depends on tensor values: torch.export cannot follow."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.head(x.flatten(1))
        return -self.head(x.flatten(1))


@pytest.mark.slow
def test_a_model_the_format_cannot_export_names_the_construct(best, tmp_path, monkeypatch, capsys):
    trained = load_trained(best)
    trained.model = ValueBranch().eval()
    monkeypatch.setattr(export, "load_trained", lambda *args: trained)
    assert run_export(best, "export", tmp_path / "m.pt2") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "test_export.py" in err and "in forward" in err
    assert "depends on tensor values" in err and "try --format torchscript" in err


@pytest.mark.slow
def test_export_takes_key_value_overrides_as_evaluate_does(best, tmp_path, capsys):
    """export.py refused `run.threads=1` ("unrecognized arguments"), which train.py and
    evaluate.py take: they reach the checkpoint's config (the data its parity inputs are
    read from, a moved table's path), and a bad one is one line."""
    assert run_export(best, "torchscript", tmp_path / "m.pt", "run.threads=1") == 0
    capsys.readouterr()
    assert run_export(best, "torchscript", tmp_path / "o.pt", "data.nope=1") == 2
    assert "data.nope" in capsys.readouterr().err


@pytest.mark.slow
def test_without_the_data_parity_runs_on_random_inputs(best, tmp_path, monkeypatch):
    def no_data(trained, n):
        raise ConfigError("data file not found")

    monkeypatch.setattr(export, "validation_inputs", no_data)
    assert run_export(best, "torchscript", tmp_path / "m.pt") == 0
    parity = json.loads((tmp_path / "m.pt.json").read_text())["parity"]
    assert parity["inputs"] == "random" and parity["passed"]


def hide_module(monkeypatch, hidden: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name)
    )


@pytest.mark.slow
def test_onnx_without_its_packages_is_one_line(best, tmp_path, monkeypatch, capsys):
    hide_module(monkeypatch, "onnxscript")
    assert run_export(best, "onnx", tmp_path / "m.onnx") == 2
    assert "pip install -e '.[export]'" in capsys.readouterr().err


@pytest.mark.slow
def test_onnx_without_onnxruntime_exports_with_a_note(best, tmp_path, monkeypatch, capsys):
    if not all(importlib.util.find_spec(m) for m in ONNX[:2]):
        pytest.skip("needs onnx and onnxscript")
    hide_module(monkeypatch, "onnxruntime")
    assert run_export(best, "onnx", tmp_path / "m.onnx") == 0
    out = capsys.readouterr().out
    assert "parity: onnxruntime is not installed: not checked" in out
    assert len(out.splitlines()) == 1 and (tmp_path / "m.onnx").stat().st_size > 0


@pytest.mark.slow
def test_an_onnx_file_alone_loads_elsewhere(best, tmp_path, capsys):
    """The weights are inside the .onnx: a serving team can copy that one file."""
    if not all(importlib.util.find_spec(m) for m in ONNX):
        pytest.skip("needs the [export] extra: onnx, onnxscript, onnxruntime")
    out = tmp_path / "model.onnx"
    assert run_export(best, "onnx", out) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.json"]
    assert json.loads((tmp_path / "model.onnx.json").read_text())["files"] == ["model.onnx"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(out, elsewhere)
    trained = load_trained(best)
    x = validation_inputs(trained, 5)
    with torch.no_grad():
        got, expected = export.run_artifact("onnx", elsewhere / "model.onnx", x), trained.model(x)
    assert torch.allclose(got, expected, atol=1e-4)


@pytest.mark.slow
def test_an_onnx_model_too_large_to_embed_names_both_files(best, tmp_path, monkeypatch, capsys):
    if not all(importlib.util.find_spec(m) for m in ONNX):
        pytest.skip("needs the [export] extra: onnx, onnxscript, onnxruntime")
    monkeypatch.setattr(formats, "EMBED_LIMIT", 0)  # as if the weights were over 2 GB
    out = tmp_path / "model.onnx"
    assert run_export(best, "onnx", out) == 0
    assert (
        "wrote " + str(out) + " + model.onnx.data (keep them together)" in capsys.readouterr().out
    )
    meta = json.loads((tmp_path / "model.onnx.json").read_text())
    assert meta["files"] == ["model.onnx", "model.onnx.data"] and meta["parity"]["passed"]
    # Exported again, small enough: the old weights file goes, not to be mistaken for it.
    monkeypatch.undo()
    assert run_export(best, "onnx", out) == 0
    assert not (tmp_path / "model.onnx.data").exists()


def train_on_table(tmp_path: Path, header: str, rows: list, task: str) -> str:
    (tmp_path / "t.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    cfg = [
        "data.name=csv",
        f"data.path={tmp_path / 't.csv'}",
        "data.label=y",
        "model.name=mlp",
        "model.width=16",
        f"task.name={task}",
        "train.epochs=4",
        "train.batch_size=16",
        "train.warmup_steps=2",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path}",
    ]
    fit(load_config(None, cfg))
    return str(tmp_path / "default" / "best.pt")


def artifact_and_predict(best: str, fmt: str, tmp_path: Path):
    """(the artifact's outputs for the raw rows of t.csv, predict.py's CSV rows for them)."""
    if fmt == "onnx" and not all(importlib.util.find_spec(m) for m in ONNX):
        pytest.skip("needs the [export] extra: onnx, onnxscript, onnxruntime")
    out = tmp_path / f"m{export.SUFFIXES[fmt]}"
    assert run_export(best, fmt, out) == 0
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert meta["input"]["units"].startswith("raw CSV columns a, b, c in this order")
    assert meta["input"]["columns"] == ["a", "b", "c"]  # for programs, not only in a sentence
    with (tmp_path / "t.csv").open(newline="") as f:
        raw = torch.tensor([[float(r[c]) for c in "abc"] for r in csv.DictReader(f)])
    assert (
        predict_main(
            ["--checkpoint", best, str(tmp_path / "t.csv"), "--out", str(tmp_path / "p.csv")]
        )
        == 0
    )
    with (tmp_path / "p.csv").open(newline="") as f:
        predicted = list(csv.DictReader(f))
    with torch.no_grad():
        return export.run_artifact(fmt, out, raw), predicted, meta


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_raw_csv_rows_get_the_predictions_of_predict_py(tmp_path, fmt):
    """Features far from 0 and 1: without the standardisation inside, raw rows come out as
    one class (0.86 accuracy instead of 0.97 in the issue)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 3, generator=g)
    x = z * torch.tensor([50.0, 10.0, 0.001]) + torch.tensor([1000.0, -300.0, 0.01])
    labels = ["yes" if a + b > 0 else "no" for a, b, _ in z.tolist()]
    rows = [
        f"{a:.4f},{b:.4f},{c:.6f},{y}" for (a, b, c), y in zip(x.tolist(), labels, strict=True)
    ]
    best = train_on_table(tmp_path, "a,b,c,y", rows, "classification")
    logits, predicted, meta = artifact_and_predict(best, fmt, tmp_path)
    assert meta["output"]["classes"] == ["no", "yes"]
    classes = [meta["output"]["classes"][i] for i in logits.argmax(1).tolist()]
    assert classes == [row["prediction"] for row in predicted]
    probability = torch.tensor([float(row["probability"]) for row in predicted])
    assert torch.allclose(logits.softmax(1).max(1).values, probability, atol=1e-4)


@pytest.mark.slow
def test_a_regression_artifact_answers_in_the_targets_units(tmp_path):
    """The model learns standardised targets; the artifact must map back, as predict.py does,
    so a serving team gets prices, not z-scores."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 3, generator=g) * 20 + 100
    y = 1000 + 50 * x[:, 0] - 20 * x[:, 1]
    rows = [
        ",".join(f"{v:.4f}" for v in [*a, b]) for a, b in zip(x.tolist(), y.tolist(), strict=True)
    ]
    best = train_on_table(tmp_path, "a,b,c,y", rows, "regression")
    got, predicted, meta = artifact_and_predict(best, "torchscript", tmp_path)
    assert meta["output"]["targets"] == ["y"]
    expected = torch.tensor([float(row["prediction"]) for row in predicted])
    assert torch.allclose(got.view(-1), expected, rtol=1e-5, atol=1e-3)
    assert got.mean() > 500  # in the targets' units (around 1000), not standardised (around 0)


# >>> images
@pytest.mark.slow
def test_an_image_artifact_takes_images_scaled_to_0_1(tmp_path):
    from test_image_folder import write_images

    from {{ cookiecutter.package_name }}.data.image_folder import decode

    for name in ("a", "b"):
        write_images(tmp_path / "images" / name, 8, seed=len(name) + ord(name))
    cfg = [
        "data.name=image_folder",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=8",
        "data.mean=0.2,0.3,0.4",
        "data.std=0.1,0.2,0.3",
        "model.width=8",
        "train.max_steps=1",
        "train.batch_size=4",
        "run.loggers=[csv]",
        "run.device=cpu",
        f"run.output_dir={tmp_path}",
    ]
    fit(load_config(None, cfg))
    best, out = str(tmp_path / "default" / "best.pt"), tmp_path / "m.pt2"
    assert run_export(best, "export", out) == 0
    units = json.loads((tmp_path / "m.pt2.json").read_text())["input"]["units"]
    assert "resized to 8x8" in units and "resizing is not in the artifact" in units
    raw = torch.stack([decode(p, 8) for p in sorted((tmp_path / "images").rglob("*.png"))])
    mean, std = (
        torch.tensor([0.2, 0.3, 0.4]).view(3, 1, 1),
        torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1),
    )
    with torch.no_grad():
        got = export.run_artifact("export", out, raw)
        expected = load_trained(best).model((raw - mean) / std)
    assert torch.allclose(got, expected, atol=1e-4)
# <<< images


def test_onnx_export_below_torch_2_7_is_refused_with_one_line(tmp_path, tiny, torch_2_6, capsys):
    out = Path(load_config(None, tiny).run.output_dir)
    fit(load_config(None, [*tiny, "model.name=mlp", "train.max_steps=1"]))
    capsys.readouterr()
    before = sorted(tmp_path.rglob("*"))
    args = ["--checkpoint", str(out / "default/last.pt"), "--format", "onnx"]
    assert export_main([*args, "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --format onnx needs torch >= 2.7" in err[0], err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_a_stop_during_export_leaves_the_previous_artifact(handlers, tmp_path, monkeypatch):
    fit(load_config(None, [*TINY, "train.epochs=1", f"run.output_dir={tmp_path}"]))
    best, out = str(tmp_path / "default" / "best.pt"), tmp_path / "model.pt"
    args = ["--checkpoint", best, "--format", "torchscript", "--out", str(out)]
    assert export_main(args) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    real = export.run_artifact

    def signalled_during_the_check(*a):  # the new artifact is staged, not yet in place
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a)

    monkeypatch.setattr(export, "run_artifact", signalled_during_the_check)
    assert export_main(args) == 75
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
# >>> images


def from_the_json(path: Path, steps: dict) -> torch.Tensor:
    """One image's input to the artifact from the export's JSON alone (numpy and Pillow, as
    a serving team would write it): no code of this project."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        resample = getattr(Image.Resampling, steps["interpolation"].upper())
        if "crop" not in steps:
            size = (steps["resize"]["width"], steps["resize"]["height"])
            image = image.resize(size, resample)
        else:
            size, short = steps["crop"]["size"], steps["resize"]["short_side"]
            w, h = image.size
            w, h = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
            image = image.resize((max(w, size), max(h, size)), resample)
            left, top = (round((side - size) / 2) for side in image.size)  # halves to even
            image = image.crop((left, top, left + size, top + size))
        pixels = np.asarray(image, dtype=np.float32) / steps["scale"]["8-bit"]
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


@pytest.mark.slow
@pytest.mark.parametrize("crop", ["0", "0.875"])
def test_the_json_s_preprocessing_reimplemented_gives_predict_s_inputs_exactly(
    tmp_path, capsys, crop
):
    """The JSON described the centre crop in words; a reimplementation that rounded the
    offset the other obvious way differed from predict.py by up to 0.0087."""
    from PIL import Image

    from {{ cookiecutter.package_name }}.data.image_decode import decode

    g = torch.Generator().manual_seed(0)
    for name, sizes in (("a", [(37, 23), (40, 31), (25, 25)]), ("b", [(23, 37), (31, 44)])):
        (tmp_path / "img" / name).mkdir(parents=True)
        for i, (w, h) in enumerate(sizes * 2):
            pixels = torch.randint(256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(tmp_path / "img" / name / f"{i}.png")
    args = ["data.name=image_folder", f"data.root={tmp_path / 'img'}", "data.image_size=16",
            f"data.crop_pct={crop}", "data.val_fraction=0.5", "train.batch_size=2",
            "train.max_steps=1", "train.warmup_steps=0", "run.device=cpu", "run.loggers=[csv]",
            f"run.output_dir={tmp_path / 'runs'}"]  # fmt: skip
    fit(load_config(None, args))
    best = str(tmp_path / "runs" / "default" / "last.pt")
    out = tmp_path / "m.pt"
    assert run_export(best, "torchscript", out) == 0
    steps = json.loads(out.with_name("m.pt.json").read_text())["input"]["preprocessing"]
    files = sorted((tmp_path / "img").rglob("*.png"))
    view = (None if crop == "0" else float(crop), steps["interpolation"])
    for path in files:  # predict.py's reader: data/image_decode.py
        assert torch.equal(from_the_json(path, steps), decode(path, 16, *view)), path
    batch = torch.stack([from_the_json(path, steps) for path in files])
    with torch.no_grad():
        served = export.run_artifact("torchscript", out, batch).softmax(-1)
    capsys.readouterr()
    predicted = tmp_path / "p.csv"
    assert predict_main(["--checkpoint", best, *map(str, files), "--out", str(predicted)]) == 0
    with predicted.open() as f:
        rows = {row["input"]: row for row in csv.DictReader(f)}
    for path, probabilities in zip(files, served.tolist(), strict=True):
        row = rows[str(path)]
        assert [float(row[f"prob_{c}"]) for c in "ab"] == pytest.approx(probabilities, abs=1e-6)
# <<< images
