"""scripts/evaluate.py: validate a checkpoint (with an optional report). Where it may write
follows outputs.py (the report folder: report.check_folder)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import ConfigError
from .cli import guard, make_parser


def evaluate_main(argv: list[str] | None = None) -> int:
    # The checkpoint's own config describes the model; overrides here choose how to evaluate.
    parser = make_parser(
        "Evaluate a checkpoint on the validation split; prints the metrics.",
        example="run.device=cpu data.num_workers=4",
    )
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument(
        "--report",
        help="folder for the report (default: <checkpoint stem>_report beside it); an earlier "
        "report there is replaced whole, a folder holding anything else is refused",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON line (for scripts)"
    )
    parser.add_argument(
        "--split",
        choices=["val", "test"],
        default="val",
        help="val: the run's validation split (default); test: its held-out test split "
        "(data.test_path, an image folder's test/), read with the checkpoint's preprocessing",
    )
    parser.add_argument(
        "--data",
        metavar="FILE",
        help="score another labelled file instead (a CSV table with the checkpoint's columns "
        "and label, a text file, a folder of class folders)",  # feature: text
        "and label, a folder of class folders)",  # feature: !text
    )
    args = parser.parse_args(argv)

    def run() -> int:
        if args.data is not None and args.split != "val":
            raise ConfigError("--data FILE and --split test each choose what to score; give one")
        stem = Path(args.checkpoint)
        part = "data_" if args.data is not None else "test_" if args.split == "test" else ""
        report = args.report or str(stem.with_name(f"{stem.stem}_{part}report"))
        metrics = evaluate_checkpoint(
            args.checkpoint, args.overrides, report, split=args.split, data=args.data
        )
        if metrics is None:  # only rank 0 reports under torchrun
            return 0
        if args.json:  # the same metrics, once, for a program to read (report.json too)
            print(json.dumps(metrics))
        else:
            print(" | ".join(f"{k} {_value(v)}" for k, v in metrics.items()))
        return 0

    return guard(run, args.debug, stoppable=True)


def _value(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def evaluate_checkpoint(
    path: str,
    overrides: list[str] = (),
    report_dir: str | None = None,
    split: str = "val",
    data: str | None = None,
) -> dict | None:
    """Rebuild the model from the checkpoint's own config (plus overrides) and validate it;
    with `report_dir`, write the evaluation report there (report.py). `split` "test": the
    run's test split instead; `data`: another labelled file (evaluate.py --data)."""
    from .. import distributed
    from ..data import build_loader, close_loader
    from ..trainer import evaluate
    from . import report
    from .inference import inference_amp, load_trained, say_drift

    if report_dir:  # before the evaluation: a refused folder costs nothing
        report.check_folder(Path(report_dir), path)
    # The model from the checkpoint alone; a bare state_dict carries no config: the defaults
    # plus the overrides describe its model.
    trained = load_trained(path, overrides)
    cfg = trained.cfg
    dist, device = distributed.setup(cfg.run.device)
    loader = None
    try:
        amp = inference_amp(trained, device, option="train.amp")  # before the data is read
        task, scored = _scored_split(trained, split, data)
        loader = build_loader(
            scored,
            cfg.data,
            2 * cfg.train.batch_size,
            train=False,
            seed=cfg.run.seed,
            rank=dist.rank,
            world_size=dist.world_size,
        )
        decide = getattr(task, "decide", None)
        collector = report.Collector(cfg.task.name, task.num_outputs, device, decide)
        model = trained.model.to(device)
        what = f"--data {data}" if data else f"the {split} split".replace("val ", "validation ")
        metrics = evaluate(model, loader, task, device, amp, collector, f"{what} of {path}")
        if report_dir:
            collector.finish()  # a collective: every rank takes part
        # What other than the validation split was scored (its metrics stay as they were).
        scored_as = {"data": data} if data is not None else {}
        if split == "test":
            scored_as = {"split": "test"}
        metrics = {"checkpoint": path, "step": trained.step, **scored_as, **metrics}
        if report_dir and dist.is_main:
            classes = trained.meta.get("classes") or trained.meta.get("labels")
            for line in report.write(Path(report_dir), metrics, collector, classes):
                print(line)
        say_drift(trained)
        return metrics if dist.is_main else None
    finally:
        if loader is not None:
            close_loader(loader)
        distributed.teardown()


def _scored_split(trained, split: str, data: str | None):
    """(task, dataset) to score: the validation split of the checkpoint's data meta (the
    training run's normalisation, classes and split), its test split, or the file `data`;
    the task is the checkpoint's, its tuned decisions (a threshold) not retuned here."""
    from .inference import validation_set

    if split == "test" or data is not None:
        return trained.task, held_out(trained, data)
    return trained.task, validation_set(trained)


def held_out(trained, data: str | None):
    """The run's test split, or the labelled file `data`, read as the checkpoint's model reads
    its inputs (columns by name, its normalisation, classes and vocabulary)."""  # feature: text
    its inputs (columns by name, its normalisation and classes)."""  # feature: !text
    from ..data import build_test_set
    from ..data.held_out import check_test_split
    from ..tasks import TASKS

    cfg = trained.cfg
    if not trained.meta:
        raise ConfigError(
            f"checkpoint {trained.path!r} holds no data meta (a bare state_dict): it cannot "
            "read a test split as its training run did; evaluate a training checkpoint"
        )
    targets = TASKS[cfg.task.name].targets
    try:
        scored = build_test_set(cfg.data, targets, trained.meta, data)
    except ConfigError as exc:  # the reader names its option; --data is what set it here
        if data is None:
            raise
        raise ConfigError(re.sub(r"\bdata\.test_(path|root)\b", "--data", str(exc))) from None
    if scored is None:
        raise ConfigError(
            f"checkpoint {trained.path!r} records no test split and the config sets none; "
            "give one with data.test_path=FILE (tables, text) or <root>/test/ (image folders), "  # feature: text
            "give one with data.test_path=FILE (tables) or <root>/test/ (image folders), "  # feature: !text
            "or score a labelled file with --data FILE"
        )
    if data is None:
        check_test_split(scored, trained.meta)
    return scored
