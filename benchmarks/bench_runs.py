"""Many small runs, cheap: what a run and a sweep trial cost beyond their own work, measured
as whole processes, paired, in one run of this script.

    python benchmarks/bench_runs.py                 # ~4 min on 2 cores: 5 pairs of each
    python benchmarks/bench_runs.py --quick         # 1 pair of each, smaller (checks it runs)
    python benchmarks/bench_runs.py --project DIR --repeats 9 --json runs.json
    python benchmarks/bench_runs.py --threads 0     # each process's default threads

Bakes the template (or takes --project) and times, in rotating order, `--repeats` pairs of:

  tiny run   the baked `scripts/train.py` (the default CNN on synthetic data, 4 epochs, csv
             logs) against a hand-written loop doing the same work with the imports it needs
             (the package's dataset and model, fused AdamW, the warm-up + cosine schedule, a
             validation per epoch and one torch.save per epoch): ratio project / loop, target
             at most 1.05;
  epoch      the default config's epoch (CNN, synthetic images, csv and TensorBoard logs),
             as whole processes of 6 and of 1 epochs, (t6 - t1) / 5, of the project and of
             the same hand-written loop: ratio loop / project, target at least 0.98 (the
             epoch's end: validation, the fsynced checkpoint and best.pt, metrics.csv and
             TensorBoard, against the loop's validation and one torch.save; curves.png off,
             as without matplotlib: the loop draws none); and the same for an overhead-bound
             configuration (a CNN of width 8 on 8x8 images: short steps, an epoch of ~0.6 s),
             over 16 and 1 epochs, (t16 - t1) / 15: over 5 epochs the processes' own
             scatter (~50 ms) moved its ratio by 10%;
  sweep      `scripts/sweep.py` with a grid of 4 tiny trials against the same 4 trials run
             one after another as `scripts/train.py` processes: ratio sweep / sequential,
             target at most 0.6; and the seconds per trial of each (the sweep's after its own
             start-up, taken as a bare `python -c "import torch"`).

Each figure is the median over pairs of the per-pair ratio (pairs share the machine's state).
Targets are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import _child_env, bake  # noqa: E402

TINY_RUN = ["train.epochs=4", "run.loggers=[csv]"]
TRIAL = ["data.train_size=256", "data.val_size=64", "model.width=8", "train.batch_size=32",
         "train.epochs=1", "run.loggers=[csv]"]  # fmt: skip
LRS = ["1e-3", "2e-3", "3e-3", "4e-3"]
SMALL = ["model.width=8", "data.image_size=8"]  # overhead-bound: steps of ~8 ms, short epochs
# Epochs of the two runs whose difference is an epoch's cost, per case (--quick: 1 and 2).
EPOCHS = {"epoch": (1, 6), "epoch_small": (1, 16)}

# The hand-written loop: what the tiny run does, written out with no framework around it.
LOOP = """
import sys, importlib, math, torch, torch.nn.functional as F
pkg, out, args = sys.argv[1], sys.argv[2], sys.argv[3:]
config, data, models = (importlib.import_module(f"{pkg}.{m}") for m in ("config", "data",
                                                                       "models"))
cfg = config.load_config(None, args)
torch.manual_seed(cfg.run.seed)
train = data.DATASETS["synthetic"](cfg.data.options, "train")
val = data.DATASETS["synthetic"](cfg.data.options, "val")
model = models.build_model(cfg.model, train.x[:2], train.num_classes)
opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr,
                        weight_decay=cfg.train.weight_decay, fused=True)
batch, epochs = cfg.train.batch_size, cfg.train.epochs
steps = len(train) // batch
total, warm = steps * epochs, max(1, int(0.05 * steps * epochs))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
    0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
for epoch in range(epochs):
    model.train()
    order = torch.randperm(len(train))
    for i in range(steps):
        idx = order[i * batch:(i + 1) * batch]
        loss = F.cross_entropy(model(train.x[idx]), train.y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(val.x[i:i + 2 * batch]) for i in range(0, len(val), 2 * batch)])
        acc = (logits.argmax(1) == val.y).float().mean().item()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, out)
    print(f"epoch {epoch + 1}: val acc {acc:.4f}")
"""


def epoch_ratio_of(pairs: list[dict], case: str, quick: bool) -> float:
    """The median over pairs of loop / project, each an epoch's cost: the difference of the
    longer and the one-epoch runs."""
    last = 2 if quick else EPOCHS[case][1]
    return statistics.median(
        (e[f"loop_{last}"] - e["loop_1"]) / (e[f"project_{last}"] - e["project_1"]) for e in pairs
    )


def timed(cmd: list[str], env: dict, cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--quick", action="store_true", help="1 pair of each, smaller runs")
    p.add_argument("--repeats", type=int, default=5, help="pairs of each (default 5)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1; 0: each process's default, as a user's run)",
    )
    p.add_argument("--project", help="time this baked project instead of baking one")
    p.add_argument("--json", help="write the numbers to this file")
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    tiny = [*TINY_RUN, "data.train_size=512", "train.epochs=2"] if args.quick else TINY_RUN
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        work = Path(tmp)
        project, package = bake(work, args.project)
        env = _child_env(project, args.threads)
        if not args.threads:  # the default: the project's auto (run.threads=0), torch's own
            env = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        threads = [f"run.threads={args.threads}"]
        # The epoch's figure compares the same work: the loop draws no curves.png, and the
        # project's one drawing at the end of a run over 30 s (~1 s with the matplotlib import)
        # would land in (t6 - t1) only. Off as without matplotlib (its cost during a run is
        # bounded by utils/logger.py's REDRAW_SHARE).
        no_plots = work / "no_plots"
        no_plots.mkdir()
        (no_plots / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None")
        epoch_env = {**env, "PYTHONPATH": os.pathsep.join([str(no_plots), env["PYTHONPATH"]])}
        loop = work / "loop.py"
        loop.write_text(LOOP)
        py = sys.executable
        pairs = {"run": [], "epoch": [], "epoch_small": [], "sweep": []}
        bare = statistics.median(timed([py, "-c", "import torch"], env, project) for _ in range(3))
        for i in range(repeats):
            out = work / f"r{i}"
            project_cmd = [py, "scripts/train.py", *tiny, *threads, f"run.output_dir={out}"]
            loop_cmd = [py, str(loop), package, str(work / f"loop{i}.pt"), *tiny, *threads]
            first, second = (project_cmd, loop_cmd) if i % 2 == 0 else (loop_cmd, project_cmd)
            a, b = timed(first, env, project), timed(second, env, project)
            run_s, loop_s = (a, b) if first is project_cmd else (b, a)
            sweep_cmd = [py, "scripts/sweep.py", "--name", f"s{i}", f"train.lr={','.join(LRS)}",
                         *TRIAL, *threads, f"run.output_dir={out}"]  # fmt: skip
            trials = [[py, "scripts/train.py", f"run.name=q{i}-{lr}", f"train.lr={lr}", *TRIAL,
                       *threads, f"run.output_dir={out}"] for lr in LRS]  # fmt: skip
            if i % 2 == 0:
                sweep_s = timed(sweep_cmd, env, project)
                sequential_s = sum(timed(cmd, env, project) for cmd in trials)
            else:
                sequential_s = sum(timed(cmd, env, project) for cmd in trials)
                sweep_s = timed(sweep_cmd, env, project)
            pairs["run"].append({"project_s": run_s, "loop_s": loop_s})
            for case, extra in (("epoch", []), ("epoch_small", SMALL)):
                epochs = {}
                for n in (1, 2) if args.quick else EPOCHS[case]:
                    settings = [f"train.epochs={n}", *extra, *threads,
                                f"run.output_dir={out}/{case}{n}"]  # fmt: skip
                    epochs[f"project_{n}"] = timed(
                        [py, "scripts/train.py", *settings], epoch_env, project
                    )
                    epochs[f"loop_{n}"] = timed(
                        [py, str(loop), package, str(work / "e.pt"), *settings], epoch_env, project
                    )
                pairs[case].append(epochs)
            pairs["sweep"].append({"sweep_s": sweep_s, "sequential_s": sequential_s})
            print(f"pair {i + 1}/{repeats}: run {run_s:.2f} s vs loop {loop_s:.2f} s; sweep "
                  f"{sweep_s:.2f} s vs 4 processes {sequential_s:.2f} s", flush=True)  # fmt: skip
    run_ratio = statistics.median(r["project_s"] / r["loop_s"] for r in pairs["run"])
    epoch_ratio, small_ratio = (epoch_ratio_of(pairs[case], case, args.quick) for case in EPOCHS)
    sweep_ratio = statistics.median(s["sweep_s"] / s["sequential_s"] for s in pairs["sweep"])
    process_s = statistics.median(s["sequential_s"] / len(LRS) for s in pairs["sweep"])
    forked_s = statistics.median((s["sweep_s"] - bare) / len(LRS) for s in pairs["sweep"])
    result = {
        "pairs": pairs, "import_torch_s": bare, "threads": args.threads, "cpus": os.cpu_count(),
        "tiny_run_ratio": run_ratio, "epoch_ratio": epoch_ratio,
        "epoch_small_ratio": small_ratio, "sweep_ratio": sweep_ratio,
        "trial_as_process_s": process_s, "trial_in_sweep_s": forked_s,
    }  # fmt: skip
    print(f"tiny run / hand-written loop: {run_ratio:.3f} (target <= 1.05)")
    print(f"epoch, hand-written loop / project: {epoch_ratio:.3f} (target >= 0.98)")
    print(f"overhead-bound epoch, loop / project: {small_ratio:.3f} (target >= 0.98)")
    print(f"sweep of 4 / 4 train.py processes: {sweep_ratio:.3f} (target <= 0.6)")
    print(f"seconds per trial: {forked_s:.2f} in the sweep, {process_s:.2f} as a process")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
