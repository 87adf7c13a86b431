"""Entry points behind scripts/*.py: parse arguments, run, and turn bad input into one line.

Exit codes: 0 success, 1 smoke test failed, 2 bad input (config, path, checkpoint),
75 stopped by SIGTERM/SIGUSR1 after saving a checkpoint (run again to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .errors import UserError


def train_main(argv: list[str] | None = None) -> int:
    parser = _parser("Train a model. Settings: --config FILE, then key=value overrides.")
    parser.add_argument("--config", help="YAML config file (default: built-in defaults)")
    args = parser.parse_args(argv)

    def run() -> int:
        from .config import load_config
        from .trainer import EXIT_PREEMPTED, fit

        result = fit(load_config(args.config, args.overrides))
        return EXIT_PREEMPTED if result["stopped"] not in (None, "max_steps") else 0

    return _guard(run, args.debug)


def evaluate_main(argv: list[str] | None = None) -> int:
    parser = _parser("Evaluate a checkpoint on the validation split; prints the metrics.")
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    args = parser.parse_args(argv)

    def run() -> int:
        metrics = evaluate_checkpoint(args.checkpoint, args.overrides)
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


def evaluate_checkpoint(path: str, overrides: list[str] = ()) -> dict | None:
    """Rebuild the model from the checkpoint's own config (plus overrides) and validate it."""
    from . import checkpoint, distributed
    from .config import load_config
    from .data import build_dataset, build_loader
    from .models import build_model
    from .trainer import evaluate

    state = checkpoint.load(path)
    # A bare state_dict carries no config: the defaults plus the overrides describe its model.
    saved = state.get("config") if isinstance(state.get("config"), dict) else {}
    cfg = load_config(base=saved, overrides=overrides)
    dist, device = distributed.setup(cfg.run.device)
    try:
        val_set = build_dataset(cfg.data, "val")
        loader = build_loader(
            val_set,
            cfg.data,
            2 * cfg.train.batch_size,
            train=False,
            seed=cfg.run.seed,
            rank=dist.rank,
            world_size=dist.world_size,
        )
        model = build_model(cfg.model, val_set.input_shape, val_set.num_classes)
        checkpoint.load_model_state(model, checkpoint.model_weights(state, path), path)
        metrics = evaluate(model.to(device), loader, device, cfg.train.amp)
        metrics = {"checkpoint": path, "step": state.get("progress", {}).get("step"), **metrics}
        return metrics if dist.is_main else None
    finally:
        distributed.teardown()


def smoke_main(root: Path, argv: list[str] | None = None) -> int:
    """Train briefly, stop, resume, evaluate the best checkpoint: the whole pipeline in
    seconds on tiny data, on CUDA with bf16 when a GPU is present, else on CPU."""
    parser = _parser("Smoke test: train -> checkpoint -> resume -> evaluate on tiny data.")
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
        first = fit(load_config(config, [*common, "train.epochs=1"]))
        second = fit(load_config(config, [*common, "train.resume=auto"]))
        steps_per_epoch = first["step"]
        if second["step"] <= first["step"] or second["epoch"] != first["epoch"] + 1:
            raise RuntimeError(f"resume did not continue from step {first['step']}: {second}")
        metrics = evaluate_checkpoint(str(Path(tmp) / cfg.run.name / "best.pt"), common)
        if metrics is None or not metrics["loss"] < float("inf"):
            raise RuntimeError(f"evaluation gave no finite loss: {metrics}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return (
        f"{device}, amp {amp}, {steps_per_epoch} steps + resume, "
        f"val acc {metrics['acc']:.3f} (chance {1 / cfg.data.num_classes:.3f})"
    )


def _parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.epochs=3")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return parser


def _guard(run, debug: bool) -> int:
    """Bad input is the user's to fix: one line naming it, exit 2, no traceback."""
    try:
        return run()
    except UserError as exc:
        if debug or os.environ.get("DEBUG"):
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank has the error
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
