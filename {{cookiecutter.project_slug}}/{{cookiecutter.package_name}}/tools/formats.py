"""The export formats: write a model as TorchScript, a torch.export program or ONNX (with its
weights inside when they fit), and run a written artifact back for the parity check."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from ..utils.device import torch_older_than

EMBED_LIMIT = 1536 * 2**20  # weights up to this size go inside the .onnx (torch's own margin)


class ExportError(UserError):
    """A model that the chosen exporter cannot handle."""


def _dynamic(model: nn.Module) -> tuple[dict]:
    """The input's dynamic dimensions: the batch, and for inputs of variable length their
    positions (1 to Serving.positions), so that a prompt of any length runs, as in TorchScript."""
    dims = {0: torch.export.Dim("batch", min=1, max=65536)}
    positions = getattr(model, "positions", None)
    if positions:
        dims[1] = torch.export.Dim("positions", min=1, max=positions)
    return (dims,)


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    # Tracing records the ops run on `example`: shapes flow from the input, so other batch
    # sizes work; Python control flow on values is frozen (torch.export reports it instead).
    traced = torch.jit.trace(model, example)
    buffer = io.BytesIO()  # serialised in memory: torch's own file writer aborts on a full disk
    torch.jit.save(traced, buffer)
    write_bytes(path, buffer.getvalue())


def export_program(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    program = torch.export.export(model, (example,), dynamic_shapes=_dynamic(model))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    write_bytes(path, buffer.getvalue())


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    if torch_older_than(2, 7):  # 2.6's exporter fails on BatchNorm with today's onnxscript
        raise ExportError(
            f"--format onnx needs torch >= 2.7 (this is {torch.__version__}); upgrade torch, "
            "or use --format export"
        )
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(
            f"--format onnx needs {' and '.join(missing)}: pip install -e '.[export]' (or use "
            "--format export)"
        )
    program = torch.onnx.export(
        model,
        (example,),
        dynamo=True,
        input_names=["input"],
        output_names=["output"],
        dynamic_shapes=_dynamic(model),
    )
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    if size <= EMBED_LIMIT:  # one file: the weights inside the protobuf
        write_bytes(path, program.model_proto.SerializeToString())
    else:  # protobuf caps a file at 2 GB: the weights go to <name>.data beside it
        program.save(str(path), external_data=True)


def write_bytes(path: Path, data: bytes) -> None:
    """Write and fsync in Python, where a full disk or a file-size limit is an OSError."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def quiet():
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
