"""What each training option costs, on and off: the default run's epoch with each of
issue 44's options against the same run without it, and (with --baseline) the run with every
option off against a project baked before the options existed, so the off path is shown to
cost nothing. Whole processes, paired, in one run of this script.

    python benchmarks/bench_options.py                          # ~8 min on 2 cores: 5 pairs
    python benchmarks/bench_options.py --quick                  # 1 pair, tiny: it runs
    python benchmarks/bench_options.py --baseline DIR --json options.json

An epoch is (t_N - t_1) / (N - 1) of whole processes of N and 1 epochs (start-up and the
first epoch's warm-up cancel out), `scripts/train.py` with the default CNN on synthetic
images, csv logs, one thread. Each variant's ratio, variant / off, is the median over pairs
of the per-pair ratio (the variants of a pair run in rotating order, so drift spreads over
all of them). Ratios are reported, not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runs import timed  # noqa: E402
from bench_training import _child_env, bake  # noqa: E402

VARIANTS = {
    "off": [],
    "ema": ["train.ema_decay=0.999"],  # an average update after each step
    "skip": ["train.on_nonfinite=skip"],  # an all-reduced flag and a GPU wait per step
    "micro_auto": ["train.micro_batch_size=auto"],  # the split path, whole batches
    "micro_half": ["train.micro_batch_size=32"],  # the default batch of 64 in two parts
}
BASE = ["run.loggers=[csv]", "data.train_size=4096", "data.val_size=256"]
QUICK = ["run.loggers=[csv]", "data.train_size=128", "data.val_size=32", "data.image_size=8"]


def epoch_seconds(cmd: list[str], env: dict, cwd: Path, out: Path, epochs: int) -> float:
    """(t_epochs - t_1) / (epochs - 1): the seconds of one epoch without the start."""
    one = timed([*cmd, "train.epochs=1", f"run.output_dir={out}-1"], env, cwd)
    many = timed([*cmd, f"train.epochs={epochs}", f"run.output_dir={out}-{epochs}"], env, cwd)
    return (many - one) / (epochs - 1)


def ratios(pairs: list[dict], against: str = "off") -> dict[str, float]:
    """{variant: median over pairs of variant / `against`} for every other variant."""
    names = [name for name in pairs[0] if name != against]
    return {n: statistics.median(p[n] / p[against] for p in pairs) for n in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--quick", action="store_true", help="1 pair, smaller runs")
    p.add_argument("--repeats", type=int, default=5, help="pairs (default 5)")
    p.add_argument("--project", help="time this baked project instead of baking one")
    p.add_argument("--baseline", help="a project baked before the options: its default run")
    p.add_argument("--json", help="write the numbers to this file")
    args = p.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, 4)
    sizes = QUICK if args.quick else BASE
    with tempfile.TemporaryDirectory(prefix="bench-options-") as tmp:
        work = Path(tmp)
        project, _ = bake(work, args.project)
        env = _child_env(project, 1)
        base = Path(args.baseline).resolve() if args.baseline else None
        base_env = _child_env(base, 1) if base else None
        train = [sys.executable, "scripts/train.py", *sizes, "run.threads=1"]
        names = [*VARIANTS, *(["baseline"] if base else [])]
        pairs = []
        for i in range(repeats):
            order = names[i % len(names) :] + names[: i % len(names)]
            pair = {}
            for name in order:
                out = work / f"{name}{i}"
                if name == "baseline":
                    pair[name] = epoch_seconds(train, base_env, base, out, epochs)
                else:
                    cmd = [*train, *VARIANTS[name]]
                    pair[name] = epoch_seconds(cmd, env, project, out, epochs)
            pairs.append(pair)
            shown = ", ".join(f"{n} {pair[n]:.2f} s" for n in names)
            print(f"pair {i + 1}/{repeats}, an epoch: {shown}", flush=True)
    found = ratios(pairs)
    for name, ratio in found.items():
        what = "the project before the options" if name == "baseline" else "this option on"
        print(f"epoch {name} / off: {ratio:.3f} ({what}, against every option off)")
    if args.json:
        record = {"pairs": pairs, "ratios": found, "cpus": os.cpu_count(), "epochs": epochs}
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
