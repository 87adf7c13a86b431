"""Prediction on new inputs with a checkpoint: each input kind has a small reader, chosen by
file type, that turns files into a batch the model takes, with the preprocessing saved in the
checkpoint's data meta (never the current config):

- CSV tables (.csv): meta["features"] columns (found by name; other columns are ignored),
  standardised with meta["mean"] / meta["std"]; the label column is optional (its values are
  copied to the output);
- tensor files (.pt): {"x": (N, ...)} (an optional "y" is copied), or a bare tensor, for
  models trained on tensor files or synthetic data (no input statistics to apply);
- images (.png, .jpg, ... or a folder of them, Pillow): RGB, resized to meta["image_size"], # feature: images
  scaled to [0, 1] and normalised with meta["mean"] / meta["std"]; # feature: images
- `split="val"`: the training run's validation split, rebuilt like evaluate.py does.  # feature: !text
- `split="val"`: the training run's validation split, rebuilt like evaluate.py does;  # feature: text
- a text prompt for a language model (--prompt): generate.py continues it.  # feature: text

Every input is read and checked (check_inputs) before the model runs: against the
checkpoint's io (sample shape, float or integer inputs) and meta (columns, classes). NaN or
inf features are refused, naming the row: a prediction from them would be a guess. Labels the
model does not know are refused too, so an accuracy is never computed against them. Each
refusal is one ConfigError naming the input and the fix; nothing is written then.

Outputs are one CSV row per input: its id, the predicted class name, its probability and
every class's (`prob_<class name>`; with two classes the decision is task.threshold's), or
the predicted values (regression: in the targets' units, mapped back with meta["target_mean"]
/ meta["target_std"]); plus the known label, if any. The CSV replaces `out` in one step,
where outputs.check_out allows it. The model runs under the checkpoint's train.amp, as
evaluate.py does (--amp overrides it).
"""

from __future__ import annotations

import csv
import io as text_io
import sys
from pathlib import Path

import torch

from ..errors import ConfigError, UserError  # feature: text
from ..errors import ConfigError  # feature: !text
from ..utils import locks
from ..utils.device import autocast
from . import cli, outputs
from .generate import check_sampling, generate  # feature: text
from .inference import Trained, device_option, inference_amp, load_trained, say_drift
from .predict_inputs import check_inputs, read_csv

__all__ = ["check_inputs", "check_options", "predict", "predict_main", "read_csv"]


def check_options(batch_size: int = 1, device: str = "auto") -> torch.device:
    """Refuse option values that cannot run (as the config refuses run.device); the device."""
    if batch_size <= 0:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    return device_option(device)


@torch.inference_mode()
def predict_rows(
    trained: Trained, x: torch.Tensor, device: torch.device, batch_size: int, amp: str = "off"
) -> list[list]:
    """The model's predictions for `x`, batch by batch, under `amp`: the task's rows of its
    decoded outputs (`rows`: a classifier's class, its probability and every class's; a # feature: multilabel
    multi-label model's labels, probabilities and decisions), else the values themselves.""" # feature: multilabel
    decoded outputs (`rows`: a classifier's class, its probability and every class's), else # feature: !multilabel
    the values themselves.""" # feature: !multilabel
    model, rows, task = trained.model.to(device), [], trained.task
    for start in range(0, len(x), batch_size):
        with autocast(device, amp):
            output = model(x[start : start + batch_size].to(device))
        output = task.decode(output.float()).cpu()
        if hasattr(task, "rows"):
            rows += task.rows(output)
        else:
            rows += [[round(v, 6) for v in row] for row in output.view(len(output), -1).tolist()]
    return rows


def columns(trained: Trained) -> list[str]:
    """The prediction columns of predict_rows' rows (the task's `columns`)."""
    if hasattr(trained.task, "columns"):
        return trained.task.columns()
    width = trained.io["num_outputs"]
    return ["prediction"] if width == 1 else [f"prediction_{i}" for i in range(width)]


def is_predictions(path: Path) -> bool:
    """Whether `path` is a CSV this tool wrote (its header: input, prediction..., label)."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            header = f.readline(4096).rstrip("\r\n").split(",")
    except (OSError, UnicodeDecodeError):
        return False
    return (
        header[0] == "input"
        and header[1:2] in (["prediction"], ["prediction_0"])
        and (header[-1] == "label")
    )


def predict(
    checkpoint: str,
    inputs: list[str],
    split: str | None = None,
    out: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    amp: str | None = None,
    force: bool = False,
) -> dict:
    """Predict every input under `amp` (None: the checkpoint's train.amp); write the CSV to
    `out` (stdout when None). Returns {"rows": n, "accuracy": of labelled classification
    rows (multi-label: the exact match ratio), else None, "amp": the mixed precision used}.""" # feature: multilabel
    rows, else None, "amp": the mixed precision used}.""" # feature: !multilabel
    target = check_options(batch_size, device)
    trained = load_trained(checkpoint)
    if trained.cfg.task.name == "language_model":  # feature: text
        raise ConfigError(f"checkpoint {checkpoint!r} is a language model: pass --prompt TEXT")  # feature: text
    amp = inference_amp(trained, target, amp)
    sources = check_inputs(trained, inputs, split)
    if out:  # after the inputs, so that a bad one is named first; before the model runs
        outputs.check_out(Path(out), [checkpoint, *inputs], is_predictions, force)
    header = columns(trained)
    # Labels given are scored for a classifier (accuracy) and a multi-label model (exact match) # feature: multilabel
    scored = trained.classes or trained.task.targets == "labels"  # feature: multilabel
    scored = trained.classes  # labels given score a classifier (accuracy) # feature: !multilabel
    table, correct, labelled = [], 0, 0
    for _, ids, x, labels in sources:
        for i, row in enumerate(predict_rows(trained, x, target, batch_size, amp)):
            label = labels[i] if labels else ""
            table.append([ids[i], *row, label])
            if labels is not None and (label != "" or not trained.classes) and scored:
                labelled += 1
                correct += row[0] == label
    buffer = text_io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["input", *header, "label"])
    writer.writerows(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        cli.placing_output()
        locks.replace_text(Path(out), buffer.getvalue())
    else:
        sys.stdout.write(buffer.getvalue())
    say_drift(trained)
    return {"rows": len(table), "accuracy": correct / labelled if labelled else None, "amp": amp}


def _parser() -> cli.Parser:
    parser = cli.Parser(  # feature: text
        description="Predict with a checkpoint: a CSV of predictions, or generated text."  # feature: text
    )  # feature: text
    parser = cli.Parser(description="Predict with a checkpoint: a CSV of predictions.")  # feature: !text
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="CSV, .pt, images, folders")  # feature: images
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="CSV or .pt files")  # feature: !images
    parser.add_argument("--checkpoint", required=True, help="a .pt file saved by training")
    parser.add_argument("--split", choices=["val"], help="the run's own validation split")
    parser.add_argument(
        "--out",
        help="CSV file to write (default: print the CSV); an earlier prediction CSV is "
        "replaced, any other existing file only with --force",
    )
    cli.force_option(parser, "an earlier prediction CSV")
    parser.add_argument("--batch-size", type=int, default=256, help="inputs per forward pass")
    parser.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda")
    parser.add_argument(
        "--amp",
        choices=["off", "bf16", "fp16"],
        help="mixed precision (default: the checkpoint's train.amp, as evaluate.py uses)",
    )
    # >>> text
    parser.add_argument("--prompt", help="language models: text to continue")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 picks the likeliest")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest")
    # <<< text
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    return parser


def predict_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run() -> int:
        # >>> text
        # Every option is checked, used or not: a nan given for --prompt's sampling must not
        # pass silently because this checkpoint predicts rows instead.
        check_sampling(args.temperature, args.top_k)
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
                args.amp,
            )
            print(text)
            return 0
        # <<< text
        done = predict(
            args.checkpoint,
            args.inputs,
            args.split,
            args.out,
            args.batch_size,
            args.device,
            args.amp,
            args.force,
        )
        if args.out:
            acc = done["accuracy"]
            note = f" (accuracy {acc:.4f} against the labels given)" if acc is not None else ""
            if done["amp"] != "off":
                note += f"; under {done['amp']} autocast, as trained (--amp off: fp32)"
            print(f"wrote {done['rows']} predictions to {args.out}{note}")
        return 0

    return cli.guard(run, args.debug, stoppable=True)
