"""scripts/consolidate.py: write the full model of a sharded (train.strategy=fsdp) checkpoint
to one file. Where it may write follows outputs.py."""

from __future__ import annotations

from pathlib import Path

from . import cli, outputs
from .cli import guard


def consolidate_main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(
        description="Write the full model of a sharded (train.strategy=fsdp) checkpoint to one "
        "file that scripts/evaluate.py and train.init_from read."
    )
    parser.add_argument("--checkpoint", required=True, help="step-N.pt, last.pt or best.pt")
    parser.add_argument(
        "--out",
        help="file to write (default: <checkpoint stem>.full.pt beside it); an earlier "
        "consolidated file is replaced, any other existing file only with --force",
    )
    cli.force_option(parser, "an earlier consolidated checkpoint")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    args = parser.parse_args(argv)

    def run() -> int:
        from ..checkpoint import consolidate

        path = Path(args.checkpoint)
        out = Path(args.out) if args.out else path.with_name(f"{path.stem}.full.pt")
        outputs.check_out(out, [path], is_consolidated, args.force)
        # A stop stays honoured while the shards are read and the file is written (through a
        # temporary and a rename: checkpoint.atomic_save), so it leaves the old one; from the
        # rename on it waits, and the exit code says the file was replaced.
        print(f"wrote {consolidate(path, out, before_rename=cli.placing_output)}")
        return 0

    return guard(run, args.debug, stoppable=True)


def is_consolidated(path: Path) -> bool:
    """Whether `path` is a file consolidate wrote (its meta names the sharded checkpoint);
    memory-mapped, so a large model is not read to find out."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch file, truncated, pickled objects: not ours
        return False
    meta = state.get("meta") if isinstance(state, dict) else None
    return isinstance(meta, dict) and "consolidated_from" in meta
