"""The end-of-run summary (rank 0): why the run stopped, its best and final validation
metrics, time and throughput, the files of its run folder, and the commands to run next with
this run's paths. Built from the Progress saved in every checkpoint, so resuming a complete
run prints it again. Also each epoch's report: its metrics.csv row and console line."""

from __future__ import annotations

import importlib.util  # feature: export
import shlex
from pathlib import Path

from tqdm import tqdm

from . import microbatch
from .checkpoint import Progress
from .config import Config
from .utils.device import memory_mb
from .utils.logger import record_run
from .utils.metrics import flatten

COMPLETE = (None, "max_steps", "early_stopping")  # stop reasons of a run with nothing left to do
REASONS = {
    "finished": "finished",
    "max_steps": "stopped at train.max_steps",
    "early_stopping": "stopped early",
}


def run_row(cfg: Config, progress: Progress, test: tuple[dict, str] | None = None) -> dict:
    """The run's line in checkpoints/runs.csv; `test`: the test split's (metrics, model)."""
    tested = {f"test_{k}": v for k, v in test[0].items()} | {"test_model": test[1]} if test else {}
    return {
        "run": cfg.run.name,
        "task": cfg.task.name,
        "model": cfg.model.name,
        "epochs": progress.epoch,
        "steps": progress.step,
        f"best_val_{cfg.best()[0]}": progress.best,
        **{f"val_{k}": v for k, v in flatten(progress.metrics).items()},
        **tested,
    }


def summary(
    cfg: Config,
    progress: Progress,
    reason: str,
    meta: dict,
    seconds: float | None = None,
    test: tuple[dict, str] | None = None,
) -> str:
    """The summary as lines of text. `reason`: a key of REASONS; `seconds`: this session's
    wall time (None when nothing was trained now); `test`: (metrics, which model) of the test
    split, scored once at the end of training."""
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    metric, mode = cfg.best()
    why = REASONS.get(reason, reason)
    if reason == "early_stopping":
        why += (
            f": val {metric} did not improve by more than {cfg.train.early_stop_min_delta:g} "
            f"for {progress.bad_epochs} epochs (train.early_stop_patience="
            f"{cfg.train.early_stop_patience})"
        )
    lines = [f"run {cfg.run.name} {why}: epoch {progress.epoch}, step {progress.step}"]
    if progress.best is not None:
        at = f" at epoch {progress.best_epoch}" if progress.best_epoch else ""
        lines.append(f"  best val {metric} ({mode}) {progress.best:.4f}{at} -> best.pt")
    if progress.metrics:
        lines.append(f"  final val: {_scalars(flatten(progress.metrics))}")
    positives = meta.get("tuned", {}).get("positives")
    if positives is not None:  # the same split each epoch: the same count
        counts = positives if isinstance(positives, list) else [positives]
        many = f"{min(counts)} to {max(counts)} per label" if len(counts) > 1 else counts[0]
        lines.append(f"  threshold tuned on the validation split's positives: {many}")
    if test is not None:
        values = _scalars(test[0])
        lines.append(f"  test ({test[1]}, data never trained on nor used to choose it): {values}")
    timing = [f"{seconds:.1f}s this session"] if seconds is not None else []
    if progress.train_seconds > 0:
        timing.append(
            f"training {progress.train_seconds:.1f}s in all, "
            f"{progress.samples / progress.train_seconds:.0f} samples/s"
        )
    if timing:
        lines.append(f"  time: {'; '.join(timing)}{microbatch.note(cfg.train, progress)}")
    files = (
        sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
        if (run_dir.is_dir())
        else []
    )
    lines.append(f"  run folder {run_dir}: {', '.join(files) or 'empty'}")
    lines.append("next:")
    lines += [f"  {name}: {command}" for name, command in next_commands(cfg, meta).items()]
    return "\n".join(lines)


def finish(cfg: Config, progress: Progress, stopped, meta: dict, seconds: float, test=None):
    """Rank 0 at the end: where a stopped run was saved; or a complete run's runs.csv line and
    its summary (+ test)."""
    if stopped not in COMPLETE:
        last = Path(cfg.run.output_dir) / cfg.run.name / "last.pt"
        print(f"stopped ({stopped}) at step {progress.step}; saved {last}")
        return
    record_run(Path(cfg.run.output_dir), run_row(cfg, progress, test))
    print(summary(cfg, progress, stopped or "finished", meta, seconds, test))


def report_complete(cfg: Config, progress: Progress, reason: str, meta: dict) -> None:
    """Rank 0, asked to resume a complete run: nothing to do, and its summary again."""
    print(
        f"run {cfg.run.name} is complete; nothing to do. To train further, resume with a "
        "larger train.epochs (or train.max_steps, or train.early_stop_patience)"
    )
    print(summary(cfg, progress, reason, meta))


def next_commands(cfg: Config, meta: dict) -> dict[str, str]:
    """{what: shell command} for this run's checkpoint: evaluate, predict, export, compare."""  # feature: export
    """{what: shell command} for this run's checkpoint: evaluate, predict, compare."""  # feature: !export
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    ckpt = run_dir / ("best.pt" if (run_dir / "best.pt").exists() else "last.pt")
    commands = {}
    # >>> fsdp
    if cfg.train.strategy == "fsdp":  # sharded: the scripts read the consolidated model
        commands["consolidate"] = ["scripts/consolidate.py", "--checkpoint", ckpt]
        ckpt = ckpt.with_name(f"{ckpt.stem}.full.pt")
    # <<< fsdp
    commands |= {
        "evaluate": ["scripts/evaluate.py", "--checkpoint", ckpt],
        "predict": ["scripts/predict.py", "--checkpoint", ckpt, *_predict_input(cfg, meta)],
    }
    # >>> export
    fmt = "onnx" if importlib.util.find_spec("onnxscript") else "export"
    commands["export"] = ["scripts/export.py", "--checkpoint", ckpt, "--format", fmt]
    # <<< export
    commands["compare"] = ["scripts/compare_runs.py", run_dir]
    if meta.get("test"):  # the held-out test split (data.test_path, an image folder's test/)
        commands["test"] = ["scripts/evaluate.py", "--checkpoint", ckpt, "--split", "test"]
    if cfg.task.name != "language_model":  # feature: text
        commands["predict"] += ["--out", run_dir / "predictions.csv"]
    return {k: shlex.join(["python", *map(str, v)]) for k, v in commands.items()}


def _predict_input(cfg: Config, meta: dict) -> list[str]:
    """Inputs that this run's data offers for scripts/predict.py: a prompt, its CSV table,  # feature: text
    """Inputs that this run's data offers for scripts/predict.py: its CSV table,  # feature: !text
    its tensor file, else its validation split."""
    opts = cfg.data.options
    # >>> text
    vocab = meta.get("vocab") or meta.get("vocabulary")
    if cfg.task.name == "language_model" and vocab:
        prompt = "".join(c for c in vocab if c.isalpha())[:1] or vocab[0]
        return ["--prompt", prompt, "--tokens", "200"]
    # <<< text
    if cfg.data.name == "csv":  # the table furthest from training: test, then validation
        return [meta.get("test", {}).get("path") or getattr(opts, "val_path", "") or opts.path]
    if cfg.data.name == "tensors":
        root = Path(opts.root)
        return [str(root / "val.pt" if (root / "val.pt").is_file() else root / "train.pt")]
    return ["--split", "val"]


def _scalars(metrics: dict) -> str:
    """The scalar metrics on one line; the per-class / per-label ones (f1/<class>, ...) are
    counted and pointed to, so the summary stays one screen whatever the classes."""
    shown = " | ".join(f"{k} {_fmt(v)}" for k, v in metrics.items() if "/" not in k)
    per = sum("/" in k for k in metrics)
    return shown + (f" (+{per} per class/label: metrics.csv, evaluate.py's report)" if per else "")


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def report_epoch(loop, stats: dict, metrics: dict, train_time: float, is_best: bool):
    """An epoch's row in metrics.csv + TensorBoard (rank 0's logger of the loop.Loop) and its
    one line on the console."""
    epoch, progress, data = loop.progress.epoch, loop.progress, loop.data
    if not stats["finished"]:  # train.max_steps inside an epoch: the part of it trained
        epoch += round(progress.epoch_samples / data.effective_batch / data.steps_per_epoch, 3)
    row = {
        "epoch": epoch,
        "step": loop.progress.step,
        "train/epoch_loss": stats["loss"],  # train/loss is the per-step curve
        **{f"val/{k}": v for k, v in metrics.items() if k != "count"},
        "lr": loop.trainee.scheduler.get_last_lr()[0],
        "time/train_s": train_time,
        "throughput/samples_per_s": stats["samples"] / train_time,
    }
    skipping = loop.train.on_nonfinite == "skip"
    if skipping:  # steps dropped as not finite, in all (nonfinite.py)
        row["train/skipped_steps"] = progress.skipped
    if loop.progress.micro_batch:  # train.micro_batch_size: the one in force, CUDA's retries
        row |= microbatch.memory_columns(loop)
    memory_name, row[memory_name] = memory_mb(loop.device)
    loop.log.epoch(row)
    if loop.dist.is_main:
        shown = {k: v for k, v in metrics.items() if k != "count" and "/" not in k}  # scalars
        tqdm.write(
            f"epoch {row['epoch']}/{loop.train.epochs} | train loss {stats['loss']:.4f} | "
            f"val {' '.join(f'{k} {v:.4f}' for k, v in shown.items())}"
            f"{' (best)' if is_best else ''} | lr {row['lr']:.2e} | {train_time:.1f}s | "
            f"{f'skipped {progress.skipped} steps | ' if skipping and progress.skipped else ''}"
            f"{row['throughput/samples_per_s']:.0f} samples/s | "
            f"{memory_name.split('/')[1].removesuffix('_mb').replace('_', ' ')} "
            f"{row[memory_name]:.0f} MB"
        )
