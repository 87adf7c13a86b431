"""scripts/train.py and scripts/smoke.py: train from a config, or the whole pipeline in
seconds on tiny data."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

from ..errors import EXIT_STOPPED
from .cli import guard, make_parser, smoke_overrides


def train_main(argv: list[str] | None = None) -> int:
    parser = make_parser(
        "Train a model. Settings: --config FILE, then key=value overrides.",
        example="train.epochs=3 train.lr=1e-3",
    )
    parser.add_argument("--config", help="YAML config file (default: built-in defaults)")
    parser.add_argument(
        "--show-config",
        action="store_true",
        help="print every setting (the chosen data, model and task's own too) with its value "
        "and meaning, as YAML a --config file can hold, and exit",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const=5,
        type=int,
        metavar="STEPS",
        help="profile STEPS optimizer steps (default 5) after 3 of warm-up on rank 0: a trace, "
        "the top operators and on CUDA a memory snapshot in <run folder>/profile*/",
    )
    args = parser.parse_args(argv)
    where: dict = {}

    def run() -> int:
        from ..config import load_config
        from ..distributed import lost_peer
        from ..trainer import COMPLETE, fit

        cfg = load_config(args.config, [*args.overrides, *smoke_overrides()])
        if args.show_config:
            from ..config.describe import describe

            print(describe(cfg), end="")
            return 0
        where["path"] = Path(cfg.run.output_dir) / cfg.run.name
        hooks = []
        if args.profile:
            from .profiling import StepProfiler

            hooks.append(StepProfiler(args.profile))
        try:
            result = fit(cfg, hooks)
        except Exception as exc:
            # Under torchrun, another rank's death: one line on each rank left, and the exit
            # code of a stop (75: rerun to resume), not a traceback of the collective.
            line = None if args.debug else lost_peer(exc)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            return EXIT_STOPPED
        finally:
            for hook in hooks:  # a run shorter than the profile: what it profiled
                hook.finish()
        return EXIT_STOPPED if result["stopped"] not in COMPLETE else 0

    return guard(run, args.debug, where)


def smoke_main(root: Path, argv: list[str] | None = None) -> int:
    """Train briefly, stop, resume, evaluate the best checkpoint: the whole pipeline in
    seconds on tiny data, on CUDA with bf16 when a GPU is present, else on CPU."""
    parser = make_parser(
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

    from ..config import load_config
    from ..trainer import fit
    from ..utils.device import default_amp
    from .evaluate import evaluate_checkpoint

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
