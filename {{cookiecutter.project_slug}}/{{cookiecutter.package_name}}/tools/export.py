"""Export a checkpoint's model for serving: TorchScript (traced), torch.export (.pt2) or ONNX,
each with a dynamic batch dimension, written beside the checkpoint by default.

The artifact is self-contained: it takes raw inputs (CSV columns as they are in the table,
images scaled to [0, 1]) and answers in the user's units, because the preprocessing the model
was trained with (feature standardisation, image normalisation, regression's map back from
standardised targets) is part of the exported graph. ONNX weights are embedded in the one
file below 1.5 GB (protobuf's 2 GB cap); a larger model gets `<name>.data` beside it.

Every export is checked against the eager model: the written file is loaded back and run on
real validation samples (the split rebuilt from the checkpoint's config and meta, as
evaluate.py does), and the largest absolute difference of the outputs must stay within
`atol`. Only an artifact that passed replaces the previous one: it is written in memory,
then to a hidden folder beside the target (.<name>.tmp<pid>/; one a killed export left is
removed by the next), fsynced, checked and renamed over it, its JSON after it (what goes in
and comes out, classes or vocabulary, task, format, parity result). The target follows  # feature: text
and comes out, classes, task, format, parity result). The target follows  # feature: !text
outputs.check_out: never a run's checkpoint or record; an existing file only where it is an
earlier export (its JSON names it), or with --force.

ONNX needs the optional extra (pip install -e ".[export]": onnx, onnxscript; onnxruntime
runs the parity check, which is skipped with a note without it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

from ..checkpoint import fsync_dir
from ..errors import UserError, first_line
from . import cli, outputs
from .formats import EXPORTERS, ExportError, quiet, run_artifact, write_bytes
from .inference import Trained, load_trained, validation_inputs
from .reproduce import trimmed
from .serving import TOKENIZER_SUFFIX, Serving, contract, parity_inputs, serving_model  # feature: text
from .serving import Serving, contract, parity_inputs, serving_model  # feature: !text

SUFFIXES = {"torchscript": ".torchscript.pt", "export": ".pt2", "onnx": ".onnx"}
ALTERNATIVES = {"torchscript": "export", "export": "torchscript", "onnx": "export"}
SAMPLES = 64  # validation inputs the parity check runs


def export(
    checkpoint: str,
    fmt: str,
    out: str | None = None,
    atol: float = 1e-4,
    force: bool = False,
    overrides: list[str] = (),
) -> dict:
    """Export, check parity, and only then put the artifact and its metadata JSON in place;
    returns that metadata. Raises ExportError (one line naming the construct and another
    format) when export fails, UserError for a bad --atol or --out or a failed write."""
    if not math.isfinite(atol) or atol < 0:  # nan would pass nothing, yet report a diff of 0
        raise UserError(f"--atol {atol} is not a tolerance; give a number >= 0, e.g. 1e-4")
    path = Path(out) if out else _default_path(Path(checkpoint), fmt)
    if path.is_dir():
        raise UserError(
            f"--out {str(path)!r} is a folder; give a file name, e.g. "
            f"--out {path / (Path(checkpoint).stem + SUFFIXES[fmt])}"
        )
    earlier = is_export(path)
    for written in _written(path, fmt):
        outputs.check_out(written, [checkpoint], lambda _: earlier, force)
    trained = load_trained(checkpoint, overrides)
    model = serving_model(trained)
    x, source = _parity_inputs(trained, model)
    inputs = parity_inputs(model, x)  # inputs of variable length: at several lengths
    with torch.no_grad():
        expected = [model(v) for v in inputs]  # before exporting: what the artifact must give
    example = x[:2] if len(x) >= 2 else torch.cat([x, x])  # batch 2: not specialised to 1
    with _writing(path) as staged:
        _export(fmt, trained, model, example, staged / path.name)
        # >>> text
        if "tokenizer" in trained.meta:  # what turns text into the artifact's token ids
            tokenizer = trained.meta["tokenizer"].encode()
            write_bytes(staged / f"{path.name}{TOKENIZER_SUFFIX}", tokenizer)
        # <<< text
        with torch.no_grad():
            got = [run_artifact(fmt, staged / path.name, v) for v in inputs]
        parity: dict = {"inputs": source, "samples": len(x), "atol": atol}
        if model.positions is not None:
            parity["lengths"] = [v.shape[1] for v in inputs]
        if got[0] is None:
            parity["note"] = "onnxruntime is not installed: not checked (pip install onnxruntime)"
        else:
            pairs = zip(got, expected, strict=True)
            diff = max((g.float() - e.float()).abs().max().item() for g, e in pairs)
            parity |= {"max_abs_diff": diff, "passed": diff <= atol}
        files = sorted(f.name for f in staged.iterdir())  # the artifact, ONNX's .data file
        meta = _metadata(trained, fmt, path, parity) | {"files": files}
        if parity.get("passed", True):  # a failed artifact goes with the staging folder
            write_bytes(staged / f"{path.name}.json", json.dumps(meta, indent=2).encode())
            cli.placing_output()
            _publish(staged, path, files)
    return meta


def is_export(artifact: Path) -> bool:
    """Whether `artifact` (and its JSON beside it) is an earlier export: the JSON names it."""
    try:
        meta = json.loads(artifact.with_name(f"{artifact.name}.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("file") == artifact.name and "parity" in meta


def _written(path: Path, fmt: str) -> list[Path]:
    """The files an export to `path` writes (or removes): the artifact, its JSON, and the
    weights file of a large ONNX model."""
    data = [path.with_name(f"{path.name}.data")] if fmt == "onnx" else []
    tokenizer = path.with_name(f"{path.name}{TOKENIZER_SUFFIX}")  # a text model's  # feature: text
    return [path, path.with_name(f"{path.name}.json"), *data, tokenizer]  # feature: text
    return [path, path.with_name(f"{path.name}.json"), *data]  # feature: !text


def _export(fmt: str, trained: Trained, model: nn.Module, example, path: Path) -> None:
    try:
        with quiet():
            EXPORTERS[fmt](model, example, path)
    except (ExportError, OSError):  # a write that failed is not the model's fault
        raise
    except Exception as exc:  # each exporter fails its own way; one line names the cause
        raise ExportError(_failure_line(fmt, trained, exc)) from exc


_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk or choose another --out",
    errno.EDQUOT: "free space within your quota or choose another --out",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or choose another --out",
    errno.ENAMETOOLONG: "choose a shorter --out",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another --out",
}


@contextlib.contextmanager
def _writing(path: Path):
    """A hidden folder beside `path` to write the new files in, removed at the end whatever
    happens; a file-system refusal becomes one line naming `path`, which is left as it was."""
    staged = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = outputs.staging(path)  # named by the pid: outputs.remove_stale knows it
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        yield staged
    except OSError as exc:
        reason = exc.strerror or str(exc)
        fix = _WRITE_FIXES.get(exc.errno, "choose a folder you may write to with --out")
        kept = " (the previous file is unchanged)" if path.is_file() else ""
        raise UserError(f"cannot write {str(path)!r}: {reason}{kept}; {fix}") from None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)


def _publish(staged: Path, path: Path, files: list[str]) -> None:
    """Rename the checked files over the old ones: side files, the artifact, then its JSON."""
    for name in sorted(files, key=lambda n: n == path.name):
        os.replace(staged / name, path.with_name(name))
    os.replace(staged / f"{path.name}.json", path.with_name(f"{path.name}.json"))
    stale = path.with_name(f"{path.name}.data")  # weights of an earlier, larger ONNX export
    if stale.name not in files and path.suffix == ".onnx":
        stale.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _default_path(checkpoint: Path, fmt: str) -> Path:
    return checkpoint.with_name(checkpoint.stem + SUFFIXES[fmt])


def _parity_inputs(trained: Trained, model: Serving) -> tuple[torch.Tensor, str]:
    """Real validation inputs, or (when the data is not here) random ones of the saved shape;
    raw, as a caller gives them to the artifact."""
    try:
        return model.raw(validation_inputs(trained, SAMPLES)), "validation"
    except UserError:
        shape, dtype = (SAMPLES, *trained.io["input_shape"]), trained.io["input_dtype"]
        g = torch.Generator().manual_seed(0)
        if dtype.startswith("int"):
            return torch.randint(trained.io["num_outputs"], shape, generator=g), "random"
        return model.raw(torch.randn(shape, generator=g)), "random"


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
    if "data-dependent" in text or "Dynamic control flow" in text:  # torch >= 2.7, 2.6
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
    return {
        "format": fmt,
        "file": path.name,
        "checkpoint": trained.path,
        "task": trained.cfg.task.name,
        "model": trained.cfg.model.name,
        "input_shape": contract(trained)["input"]["shape"],
        "input_dtype": trained.io["input_dtype"],
        "num_outputs": trained.io["num_outputs"],
        "classes": trained.classes,
        **_decision(trained),
        "vocab": trained.meta.get("vocab"),  # feature: text
        **contract(trained),
        "parity": parity,
        "torch": str(torch.__version__),
        "trained_from": trimmed(trained.record),  # the commit, config and data digests
    }


def _decision(trained: Trained) -> dict:
    """How predict.py decides a classifier's class from the artifact's outputs: with two
    classes the second where its probability (softmax) reaches the (tuned) threshold."""
    if trained.classes is None:
        return {}
    if len(trained.classes) != 2:
        return {"decision": "the class of the largest output (argmax)"}
    threshold = trained.task.threshold
    return {
        "threshold": threshold,
        "decision": f"{trained.classes[1]!r} where softmax(output)[1] >= threshold, else "
        f"{trained.classes[0]!r}",
    }


def export_main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(  # overrides as evaluate.py takes them: the model is the checkpoint's
        "Export a checkpoint's model, checked against the eager model.",
        example="data.path=<the table moved> (the parity check reads validation inputs)",
    )
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument("--format", required=True, choices=["torchscript", "export", "onnx"])
    parser.add_argument(
        "--out",
        help="file to write (default: beside the checkpoint); an earlier export there (its "
        "JSON names it) is replaced once the new one passed, any other file only with --force",
    )
    cli.force_option(parser, "an earlier export")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest output difference")
    args = parser.parse_args(argv)

    def run() -> int:
        meta = export(
            args.checkpoint, args.format, args.out, args.atol, args.force, args.overrides
        )
        parity, where = meta["parity"], f"{Path(meta['checkpoint']).parent}/{meta['file']}"
        where = args.out or where
        if len(meta["files"]) > 1:  # ONNX over 2 GB: the weights are a second file
            where += f" + {' + '.join(meta['files'][1:])} (keep them together)"
        if "note" in parity:
            print(f"wrote {where} (+ .json); parity: {parity['note']}")
            return 0
        line = (
            f"max abs difference {parity['max_abs_diff']:.2e} on {parity['samples']} "
            f"{parity['inputs']} inputs (atol {parity['atol']:g})"
        )
        if not parity["passed"]:
            print(
                f"error: {args.format} export of {where} FAILED parity: {line}; nothing written, "
                "any previous file is unchanged",
                file=sys.stderr,
            )
            return 1
        print(f"wrote {where} (+ .json): {line}")
        return 0

    return cli.guard(run, args.debug, stoppable=True)
