"""Entry points behind scripts/*.py: parse arguments, run, and turn bad input into one line.

Exit codes: 0 success, 1 smoke test or export parity check failed, 2 bad input (config, path,
checkpoint, data, a full disk or an unwritable folder), 75 stopped by SIGTERM/SIGUSR1 or a
first Ctrl-C after saving a checkpoint (run again to resume), 130 a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from .errors import UserError, first_line, is_out_of_memory, user_message


def train_main(argv: list[str] | None = None) -> int:
    parser = _parser(
        "Train a model. Settings: --config FILE, then key=value overrides.",
        example="train.epochs=3 train.lr=1e-3",
    )
    parser.add_argument("--config", help="YAML config file (default: built-in defaults)")
    args = parser.parse_args(argv)
    where: dict = {}

    def run() -> int:
        from .config import load_config
        from .trainer import COMPLETE, EXIT_PREEMPTED, fit

        cfg = load_config(args.config, args.overrides)
        where["path"] = Path(cfg.run.output_dir) / cfg.run.name
        result = fit(cfg)
        return EXIT_PREEMPTED if result["stopped"] not in COMPLETE else 0

    return _guard(run, args.debug, where)


def evaluate_main(argv: list[str] | None = None) -> int:
    # The checkpoint's own config describes the model; overrides here choose how to evaluate.
    parser = _parser(
        "Evaluate a checkpoint on the validation split; prints the metrics.",
        example="run.device=cpu data.num_workers=4",
    )
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument(
        "--report", help="folder for the report (default: <checkpoint stem>_report beside it)"
    )
    args = parser.parse_args(argv)

    def run() -> int:
        stem = Path(args.checkpoint)
        report = args.report or str(stem.with_name(f"{stem.stem}_report"))
        metrics = evaluate_checkpoint(args.checkpoint, args.overrides, report)
        if metrics is not None:  # only rank 0 reports under torchrun
            print(
                " | ".join(
                    f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in metrics.items()
                )
            )
            print(json.dumps(metrics))
        return 0

    return _guard(run, args.debug)


def consolidate_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the full model of a sharded (train.strategy=fsdp) checkpoint to one "
        "file that scripts/evaluate.py and train.init_from read."
    )
    parser.add_argument("--checkpoint", required=True, help="step-N.pt, last.pt or best.pt")
    parser.add_argument("--out", help="file to write (default: <checkpoint>.full.pt beside it)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        from .checkpoint import consolidate

        print(f"wrote {consolidate(args.checkpoint, args.out)}")
        return 0

    return _guard(run, args.debug)


def compare_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compare runs: a table of their results and the settings that differ, "
        "and their validation curves on one plot."
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run folders (checkpoints/<run.name>), folders of runs (a sweep), or a glob: "
        "checkpoints/*",
    )
    parser.add_argument("--out", default="compare.png", help="the plot (default: compare.png)")
    parser.add_argument("--x", choices=("step", "epoch"), default="step", help="x axis")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        from .compare import compare

        return compare(args.runs, Path(args.out), args.x)

    return _guard(run, args.debug)


def evaluate_checkpoint(
    path: str, overrides: list[str] = (), report_dir: str | None = None
) -> dict | None:
    """Rebuild the model from the checkpoint's own config (plus overrides) and validate it;
    with `report_dir`, write the evaluation report there (report.py)."""
    from . import distributed, report
    from .data import build_loader, close_loader
    from .inference import load_trained
    from .trainer import build_data, evaluate

    # The model from the checkpoint alone; a bare state_dict carries no config: the defaults
    # plus the overrides describe its model.
    trained = load_trained(path, overrides)
    cfg = trained.cfg
    dist, device = distributed.setup(cfg.run.device)
    loader = None
    try:
        # The checkpoint's data meta: the training run's normalisation, classes and split.
        _, val_set, _, task = build_data(cfg, trained.meta or None)
        loader = build_loader(
            val_set,
            cfg.data,
            2 * cfg.train.batch_size,
            train=False,
            seed=cfg.run.seed,
            rank=dist.rank,
            world_size=dist.world_size,
        )
        collector = report.Collector(cfg.task.name, task.num_outputs, device)
        model = trained.model.to(device)
        metrics = evaluate(model, loader, task, device, cfg.train.amp, collector)
        if report_dir:
            collector.finish()  # a collective: every rank takes part
        metrics = {"checkpoint": path, "step": trained.step, **metrics}
        if report_dir and dist.is_main:
            classes = trained.meta.get("classes")
            for line in report.write(Path(report_dir), metrics, collector, classes):
                print(line)
        return metrics if dist.is_main else None
    finally:
        if loader is not None:
            close_loader(loader)
        distributed.teardown()


def predict_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Predict with a checkpoint: a CSV of predictions, or generated text."
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="CSV, .pt, images, folders")
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument("--split", choices=["val"], help="the run's own validation split")
    parser.add_argument("--out", help="CSV file to write (default: print the CSV)")
    parser.add_argument("--batch-size", type=int, default=256, help="inputs per forward pass")
    parser.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda")
    parser.add_argument("--prompt", help="language models: text to continue")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 picks the likeliest")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        from .predict import generate, predict

        if args.prompt is not None:
            if args.inputs or args.split:
                given = repr(args.inputs[0]) if args.inputs else f"--split {args.split}"
                raise UserError(f"--prompt continues text: leave out {given}, or the prompt")
            text = generate(
                args.checkpoint,
                args.prompt,
                args.tokens,
                args.temperature,
                args.top_k,
                args.device,
            )
            print(text)
            return 0
        done = predict(
            args.checkpoint, args.inputs, args.split, args.out, args.batch_size, args.device
        )
        if args.out:
            acc = done["accuracy"]
            note = f" (accuracy {acc:.4f} against the labels given)" if acc is not None else ""
            print(f"wrote {done['rows']} predictions to {args.out}{note}")
        return 0

    return _guard(run, args.debug)


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Export a checkpoint's model, checked against the eager model."
    )
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument("--format", required=True, choices=["torchscript", "export", "onnx"])
    parser.add_argument("--out", help="file to write (default: beside the checkpoint)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest output difference")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        from .export import export

        meta = export(args.checkpoint, args.format, args.out, args.atol)
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

    return _guard(run, args.debug)


def smoke_main(root: Path, argv: list[str] | None = None) -> int:
    """Train briefly, stop, resume, evaluate the best checkpoint: the whole pipeline in
    seconds on tiny data, on CUDA with bf16 when a GPU is present, else on CPU."""
    parser = _parser(
        "Smoke test: train -> checkpoint -> resume -> evaluate on tiny data.",
        example="run.device=cpu model.name=mlp",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        summary = _smoke(root, args.overrides)
    except Exception as exc:  # report any failure as one line; --debug shows the traceback
        if args.debug:
            raise
        print(
            f"smoke test FAILED after {time.perf_counter() - start:.1f}s: {exc}", file=sys.stderr
        )
        return 1
    print(f"smoke test passed in {time.perf_counter() - start:.1f}s: {summary}")
    return 0


def _smoke(root: Path, overrides: list[str]) -> str:
    import torch

    from .config import load_config
    from .trainer import fit
    from .utils.device import default_amp

    # bf16 where the GPU has it natively, fp16 + loss scaling on older GPUs, fp32 on CPU.
    amp = default_amp(torch.device("cuda")) if torch.cuda.is_available() else "off"
    with tempfile.TemporaryDirectory(prefix="smoke-") as tmp:
        common = [f"run.output_dir={tmp}", f"train.amp={amp}", *overrides]
        config = root / "configs" / "experiments" / "smoke.yaml"
        cfg = load_config(config, common)  # bad overrides fail here, before any training
        first = _fit_quietly(fit, load_config(config, [*common, "train.epochs=1"]))
        second = _fit_quietly(fit, load_config(config, [*common, "train.resume=auto"]))
        steps_per_epoch = first["step"]
        if second["step"] <= first["step"] or second["epoch"] != first["epoch"] + 1:
            raise RuntimeError(f"resume did not continue from step {first['step']}: {second}")
        metrics = evaluate_checkpoint(str(Path(tmp) / cfg.run.name / "best.pt"), common)
        if metrics is None or not metrics["loss"] < float("inf"):
            raise RuntimeError(f"evaluation gave no finite loss: {metrics}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return (
        f"{device}, amp {amp}, {steps_per_epoch} steps + resume, "
        f"val acc {metrics['acc']:.3f} (chance {1 / cfg.data.options.num_classes:.3f})"
    )


def _fit_quietly(fit, cfg) -> dict:
    """fit(cfg), echoing only its run and epoch lines: the end-of-run summary's next commands
    would point into the smoke test's temporary folder, gone when it ends."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return fit(cfg)
    finally:
        for line in out.getvalue().splitlines():
            if line.startswith(("run ", "epoch ", "settings changed")) and " finished" not in line:
                print(line)


def _parser(description: str, example: str) -> argparse.ArgumentParser:
    """A script's parser; `example` shows overrides that mean something to that script."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return parser


def _guard(run, debug: bool, where: dict | None = None) -> int:
    """Bad input is the user's to fix: one line naming it, exit 2, no traceback.

    Besides UserError, that covers what the file system refuses (a full disk, a file-size
    limit, a read-only or unwritable folder, a file where a folder should be, a name too long)
    and allocations too large for the machine. Other errors keep their traceback."""
    _ignore_sigxfsz()
    debug = debug or bool(os.environ.get("DEBUG"))
    try:
        return run()
    except UserError as exc:
        if debug:
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank has the error
            print(f"error: {user_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, MemoryError) as exc:
        message = _os_error_line(exc, (where or {}).get("path")) or _memory_error_line(exc)
        if debug or message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


# errno -> the fix. An OSError naming a file is the user's to fix; without a file name, only
# these write failures are (torch.save's failed writes name no file).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
_FS_FIXES = {
    errno.ENOSPC: "free space on that disk or choose another run.output_dir, then rerun "
    "with train.resume=auto",
    errno.EDQUOT: "free space within your quota or choose another run.output_dir, then rerun "
    "with train.resume=auto",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or choose another run.output_dir, then "
    "rerun with train.resume=auto",
    errno.EROFS: "choose a writable run.output_dir",
    errno.EACCES: "choose a run.output_dir you may write to, or fix the permissions",
    errno.EPERM: "choose a run.output_dir you may write to, or fix the permissions",
    errno.EEXIST: "remove or rename that file, or choose another run.name",
    errno.ENOTDIR: "a part of that path is a file, not a folder: remove or rename it, or "
    "choose another run.output_dir",
    errno.EISDIR: "a folder is where a file should be: remove or rename it",
    errno.ENAMETOOLONG: "choose a shorter run.name or run.output_dir",
}


def _os_error_line(exc: BaseException, run_dir: Path | None) -> str | None:
    """One line for a file-system refusal, or None for anything else.

    torch.save reports a failed write as a RuntimeError whose context is the OSError."""
    if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError):
        exc = exc.__context__
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    if exc.filename is None and exc.errno not in _WRITE_ERRNOS:
        return None  # e.g. a socket error: not a path the user can fix
    reason = exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))
    fix = _FS_FIXES.get(exc.errno, "check the path")
    if exc.filename is None:
        place = f" under {str(run_dir)!r}" if run_dir else ""
        return f"cannot write{place}: {reason}; {fix}"
    # A temporary file (.name.tmpPID) stands for the file it was about to replace.
    path = re.sub(r"/\.([^/]+)\.tmp\d+$", r"/\1", os.fsdecode(exc.filename))
    if len(path) > 120:  # a name too long for the file system is too long for one line
        path = f"{path[:60]}...{path[-50:]}"
    return f"cannot use {path!r}: {reason}; {fix}"


def _memory_error_line(exc: BaseException) -> str | None:
    if not is_out_of_memory(exc):
        return None
    return (
        f"out of memory ({first_line(exc)}); lower train.batch_size, model.width or "
        "model.depth, or the data.* sizes"
    )


def _ignore_sigxfsz() -> None:
    # Past a file-size limit (ulimit -f) the kernel kills the process with SIGXFSZ by default;
    # ignored, the write fails with EFBIG instead, which _guard reports on one line.
    if hasattr(signal, "SIGXFSZ"):
        with contextlib.suppress(ValueError):  # not the main thread: leave the default
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
