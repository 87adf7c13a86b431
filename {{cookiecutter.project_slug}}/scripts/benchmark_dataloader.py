"""Measure data loading alone: batches/s of the training loader for several num_workers values,
and suggest one.

    python scripts/benchmark_dataloader.py                      # the default config
    python scripts/benchmark_dataloader.py --config configs/experiments/image_folder.yaml  # feature: images
    python scripts/benchmark_dataloader.py --config configs/experiments/csv_regression.yaml  # feature: !images
    python scripts/benchmark_dataloader.py --workers 0 2 4 8 --batches 200 --json

The loader is built exactly as training builds it (trainer.build_data, then data.build_loader,
from the config file and key=value overrides; train.batch_size; pinned memory when CUDA is
present) and iterated with no model. The time to the first batch (worker start-up) and a few
warm-up batches are left out of the rate; each rate is the median of --repeats windows of
--batches batches. If the loader delivers many more batches/s than training takes steps/s,
data loading is not the bottleneck.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

import torch

try:
    from {{ cookiecutter.package_name }} import config, data, errors, trainer
    from {{ cookiecutter.package_name }}.tools.cli import Parser
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

WITHIN = 0.10  # suggest the fewest workers whose rate is within 10% of the best


def worker_counts(cpus: int) -> list[int]:
    """0, 1, 2, 4 capped by the CPU count (more processes than cores only contend); try other
    values with --workers."""
    return [w for w in (0, 1, 2, 4) if w <= cpus]


def suggest(rates: dict[int, float]) -> int:
    """The fewest workers within WITHIN of the best rate: each worker costs start-up time and
    memory (a copy of the dataset object), so a marginal gain is not worth one."""
    best = max(rates.values())
    return min(w for w, r in rates.items() if r >= (1 - WITHIN) * best)


def endless(loader):
    """Batches across epoch boundaries, reshuffling as training does."""
    epoch = 0
    while True:
        data.set_epoch(loader, epoch)
        yield from loader
        epoch += 1


def measure(dataset, cfg, workers: int, batches: int, warmup: int, repeats: int, pin: bool):
    data_cfg = dataclasses.replace(cfg.data, num_workers=workers)
    loader = data.build_loader(
        dataset, data_cfg, cfg.train.batch_size, train=True, seed=cfg.run.seed, pin_memory=pin
    )
    if len(loader) == 0:
        raise errors.ConfigError(
            f"train.batch_size={cfg.train.batch_size} exceeds the {len(dataset)} training "
            "samples: the loader yields no batch"
        )
    start = time.perf_counter()
    stream = endless(loader)
    try:
        next(stream)
        first = time.perf_counter() - start
        for _ in range(warmup):
            next(stream)
        rates = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(batches):
                next(stream)
            rates.append(batches / (time.perf_counter() - t))
    finally:
        stream.close()  # ends the epoch iterator
        data.close_loader(loader)  # and the persistent workers, before the next setting starts
    rate = statistics.median(rates)
    return {
        "num_workers": workers,
        "batches_per_s": rate,
        "samples_per_s": rate * cfg.train.batch_size,
        "first_batch_s": first,
        "all_batches_per_s": rates,
    }


def main(argv: list[str] | None = None) -> int:
    # An argument error: one line
    parser = Parser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. data.name=x")
    parser.add_argument("--config", help="YAML config file (default: built-in defaults)")
    parser.add_argument("--workers", type=int, nargs="+", help="num_workers values to try")
    parser.add_argument("--batches", type=int, default=100, help="batches per timed window")
    parser.add_argument("--warmup", type=int, default=3, help="batches left out after the first")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per setting")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        cfg = config.load_config(args.config, args.overrides)
        dataset = trainer.build_data(cfg)[0]  # the training split
    except errors.UserError as exc:
        print(f"error: {errors.user_message(exc)}", file=sys.stderr)
        return 2
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = args.workers or worker_counts(cpus or 1)
    # As training does: page-locked batches only when they go to a CUDA device.
    on_cuda = torch.cuda.is_available() and cfg.run.device.startswith(("auto", "cuda"))
    pin = cfg.data.pin_memory and on_cuda
    rows = []
    for w in workers:
        try:
            rows.append(measure(dataset, cfg, w, args.batches, args.warmup, args.repeats, pin))
        except errors.UserError as exc:  # e.g. an image that cannot be decoded, in a worker
            print(f"error: {errors.user_message(exc)}", file=sys.stderr)
            return 2
        if not args.json:
            r = rows[-1]
            print(
                f"num_workers={w:<2} {r['batches_per_s']:9.1f} batches/s "
                f"{r['samples_per_s']:10.0f} samples/s  first batch {r['first_batch_s']:.2f}s"
            )
    best = suggest({r["num_workers"]: r["batches_per_s"] for r in rows})
    result = {
        "dataset": cfg.data.name,
        "batch_size": cfg.train.batch_size,
        "cpus": cpus,
        "pin_memory": pin,
        "configured_num_workers": cfg.data.num_workers,
        "results": rows,
        "suggested_num_workers": best,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"suggested: data.num_workers={best} (configured: {cfg.data.num_workers}; fewest "
        f"workers within {WITHIN:.0%} of the best rate, on {cpus} CPUs, batch "
        f"{cfg.train.batch_size})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
