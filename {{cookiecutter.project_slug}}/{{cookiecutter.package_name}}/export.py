"""Export a checkpoint's model for serving: TorchScript (traced), torch.export (.pt2) or ONNX,
each with a dynamic batch dimension, written beside the checkpoint by default.

Every export is checked against the eager model: the written file is loaded back and run on
real validation samples (the split rebuilt from the checkpoint's config and meta, as
evaluate.py does), and the largest absolute difference of the outputs must stay within
`atol`. A JSON file beside the artifact says how to feed it: input shape and dtype, classes
or vocabulary, the preprocessing meta, the task, the format and the parity result.

ONNX needs the optional extra (pip install -e ".[export]": onnx, onnxscript; onnxruntime
runs the parity check, which is skipped with a note without it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from .errors import UserError, first_line
from .inference import Trained, load_trained, validation_inputs

SUFFIXES = {"torchscript": ".torchscript.pt", "export": ".pt2", "onnx": ".onnx"}
ALTERNATIVES = {"torchscript": "export", "export": "torchscript", "onnx": "export"}
SAMPLES = 64  # validation inputs the parity check runs


class ExportError(UserError):
    """A model that the chosen exporter cannot handle."""


def _batch_dim() -> dict:
    return {0: torch.export.Dim("batch", min=1, max=65536)}


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    # Tracing records the ops run on `example`: shapes flow from the input, so other batch
    # sizes work; Python control flow on values is frozen (torch.export reports it instead).
    traced = torch.jit.trace(model, example)
    torch.jit.save(traced, str(path))


def export_program(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    program = torch.export.export(model, (example,), dynamic_shapes=(_batch_dim(),))
    torch.export.save(program, str(path))


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(
            f"--format onnx needs {' and '.join(missing)}: pip install -e '.[export]' (or use "
            "--format export)"
        )
    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=True,
        input_names=["input"],
        output_names=["output"],
        dynamic_shapes=(_batch_dim(),),
    )


@contextlib.contextmanager
def _quiet():
    """The exporters narrate every stage, log what they try (the ONNX one warns about
    torchvision ops no model here uses) and trip deprecation warnings inside torch: none is
    about the user's model, and a failure is reported as one line anyway."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),  # graph dumps of a failed export
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


EXPORTERS = {"torchscript": export_torchscript, "export": export_program, "onnx": export_onnx}


def run_artifact(fmt: str, path: Path, x: torch.Tensor) -> torch.Tensor | None:
    """The written artifact's outputs for `x`, loaded back from its file; None where nothing
    here can run it (ONNX without onnxruntime)."""
    if fmt == "torchscript":
        with warnings.catch_warnings():  # torch >= 2.10 calls TorchScript deprecated: we know
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path))(x)
    if fmt == "export":
        return torch.export.load(str(path)).module()(x)
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"input": x.numpy()})[0])


def export(checkpoint: str, fmt: str, out: str | None = None, atol: float = 1e-4) -> dict:
    """Export, check parity, write the metadata JSON; returns that metadata. Raises
    ExportError (one line naming the construct and another format) when export fails."""
    trained = load_trained(checkpoint)
    path = Path(out) if out else _default_path(Path(checkpoint), fmt)
    x, source = _parity_inputs(trained)
    model = serving_model(trained)
    with torch.no_grad():
        expected = model(x)  # before exporting: what the artifact must reproduce
    example = x[:2] if len(x) >= 2 else torch.cat([x, x])  # batch 2: not specialised to 1
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _quiet():
            EXPORTERS[fmt](model, example, path)
    except ExportError:
        raise
    except Exception as exc:  # each exporter fails its own way; one line names the cause
        raise ExportError(_failure_line(fmt, trained, exc)) from exc
    with torch.no_grad():
        got = run_artifact(fmt, path, x)
    parity: dict = {"inputs": source, "samples": len(x), "atol": atol}
    if got is None:
        parity["note"] = "onnxruntime is not installed: not checked (pip install onnxruntime)"
    else:
        diff = (got.float() - expected.float()).abs().max().item()
        parity |= {"max_abs_diff": diff, "passed": diff <= atol}
    meta = _metadata(trained, fmt, path, parity)
    path.with_name(path.name + ".json").write_text(json.dumps(meta, indent=2))
    return meta


class _InTargetUnits(nn.Module):
    """A regression model with the task's decode inside (outputs * std + mean of the
    training targets): the artifact answers in the targets' own units, as predict.py does."""

    def __init__(self, model: nn.Module, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) * self.std + self.mean  # (N, T) * (T,) + (T,)


def serving_model(trained: Trained) -> nn.Module:
    """What the artifact computes: the model, mapped back to the targets' units for
    regression (which learns standardised targets)."""
    if trained.cfg.task.name != "regression":
        return trained.model
    return _InTargetUnits(trained.model, trained.task.mean, trained.task.std).eval()


def _default_path(checkpoint: Path, fmt: str) -> Path:
    return checkpoint.with_name(checkpoint.stem + SUFFIXES[fmt])


def _parity_inputs(trained: Trained) -> tuple[torch.Tensor, str]:
    """Real validation inputs, or (when the data is not here) random ones of the saved shape."""
    try:
        return validation_inputs(trained, SAMPLES), "validation"
    except UserError:
        shape, dtype = (SAMPLES, *trained.io["input_shape"]), trained.io["input_dtype"]
        g = torch.Generator().manual_seed(0)
        if dtype.startswith("int"):
            return torch.randint(trained.io["num_outputs"], shape, generator=g), "random"
        return torch.randn(shape, generator=g), "random"


def _failure_line(fmt: str, trained: Trained, exc: Exception) -> str:
    """One line: the model, the operator or code line the exporter stopped at, its reason."""
    while exc.__cause__ is not None:  # ONNX wraps torch.export's error: the cause says more
        exc = exc.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # colour codes
    where = []
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', text)
    if frames:  # the model's own line that the exporter could not follow
        file, line, function = frames[-1]
        where.append(f"{Path(file).name}:{line} in {function}")
    op = re.search(r"(aten::\w+|aten\.\w+|prim::\w+|torch\.ops\.[\w.]+)", text)
    if op:
        where.append(f"operator {op.group(1)}")
    if "data-dependent" in text:
        where.append("a Python branch or shape that depends on tensor values")
    at = f" at {', '.join(where)}" if where else ""
    alternative = ALTERNATIVES[fmt]
    if fmt == "onnx" and "onnx" not in type(exc).__module__:
        alternative = "torchscript"  # torch.export, ONNX's first step, failed: so would export
    return (
        f"--format {fmt} cannot export model.name={trained.cfg.model.name}{at} "
        f"({type(exc).__name__}: {first_line(Exception(text), 120)}); try --format "
        f"{alternative}"
    )


def _metadata(trained: Trained, fmt: str, path: Path, parity: dict) -> dict:
    preprocessing = {
        k: v for k, v in trained.meta.items() if k not in ("classes", "vocab", "split")
    }
    return {
        "format": fmt,
        "file": path.name,
        "checkpoint": trained.path,
        "task": trained.cfg.task.name,
        "model": trained.cfg.model.name,
        "input_shape": ["batch", *trained.io["input_shape"]],
        "input_dtype": trained.io["input_dtype"],
        "num_outputs": trained.io["num_outputs"],
        "classes": trained.classes,
        "vocab": trained.meta.get("vocab"),
        "preprocessing": preprocessing,
        "parity": parity,
        "torch": str(torch.__version__),
    }
