"""Fine-tuning a pretrained model: the baked project against a hand-written loop over the same
library model, data and batch, per epoch (its steps), with samples/s and peak memory, and
whether the data pipeline keeps up with the default workers.

    python benchmarks/bench_finetune.py --python ZOO_PYTHON            # ~8 min on 2 cores
    python benchmarks/bench_finetune.py --python ZOO_PYTHON --quick    # 1 repeat, 2 epochs

ZOO_PYTHON is an environment with timm, torchvision and transformers (README: Pretrained
models; tests/test_zoo_env.py makes one). Two cases, weights made on the spot (random init
saved in the library's own format: no network):

  vision  timm resnet18 on the demo image folder at 64 px (480 PNGs, 6 classes), batch 32,
          2 loader workers, all of it trained (no frozen epoch), as the example config;
  text    a 4-layer BERT (hidden 128) on the demo tickets (1,200 rows), batch 32, dynamic
          padding, as configs/experiments/hf_text_classifier.yaml.

For each, `--repeats` pairs in alternating order: `scripts/train.py` (its metrics.csv gives each
epoch's training seconds) and the loop (the package's dataset read by a plain DataLoader, the
library's model, fused AdamW with the same parameter groups, warm-up + cosine, clipping, the
loss; no validation, checkpoint or log). The figure: loop / project of the fastest epoch after
the first (the least disturbed on shared cores), median over pairs (target at least 0.98), and
the same of the fastest epoch of all runs of each. Then the loader alone, an epoch of
batches with no model: its samples/s against training's (the pipeline is not the bottleneck
when it is several times faster). Targets are reported, not asserted.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import _child_env, bake  # noqa: E402

# Run by ZOO_PYTHON: make the weights, or train with the hand-written loop, or read batches.
CHILD = r"""
import importlib, json, math, resource, sys, time
from pathlib import Path
import torch, torch.nn.functional as F
pkg, mode, case, work, epochs, *args = sys.argv[1:]
work, epochs = Path(work), int(epochs)
if mode == "weights":
    if case == "vision":
        import timm
        torch.save(timm.create_model("resnet18").state_dict(), work / "resnet18.pth")
    else:
        sys.path.insert(0, "tests")
        import csv, test_hf, transformers
        texts = [r["text"] for r in csv.DictReader(open(work / "demo/tickets.csv"))]
        test_hf.tiny_bert(work / "bert", texts)
        cfg = transformers.BertConfig.from_pretrained(work / "bert")
        cfg.update(dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=512))
        transformers.BertForSequenceClassification(cfg).save_pretrained(work / "bert")
    raise SystemExit(0)
config, trainer = (importlib.import_module(f"{pkg}.{m}") for m in ("config", "trainer"))
cfg = config.load_config(args[0], args[1:])
train_set, _, meta, task = trainer.build_data(cfg)
torch.manual_seed(0)
text = cfg.data.name == "text_table"
batch = cfg.train.batch_size
if text:  # dynamic padding: the dataset pads each batch of indices it is given
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(train_set), batch, True)
    loader = torch.utils.data.DataLoader(train_set, batch_size=None, sampler=sampler)
else:
    loader = torch.utils.data.DataLoader(train_set, batch, shuffle=True, drop_last=True,
        num_workers=cfg.data.num_workers, persistent_workers=cfg.data.num_workers > 0)
times, samples = [], 0
if mode == "loader":
    for epoch in range(epochs):
        start = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        times.append(time.perf_counter() - start)
    print(json.dumps({"epoch_s": times, "samples": n}))
    raise SystemExit(0)
if text:
    import transformers
    net = transformers.AutoModelForSequenceClassification.from_pretrained(
        cfg.model.options.arch, num_labels=task.num_outputs, ignore_mismatched_sizes=True)
    pad = meta["pad_id"]
    model = lambda x: net(input_ids=x, attention_mask=(x != pad).long()).logits
else:
    import timm
    net = timm.create_model("resnet18", pretrained=True, num_classes=task.num_outputs,
                            pretrained_cfg_overlay={"file": cfg.model.options.weights})
    model = net
params = [p for p in net.parameters()]
groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.train.weight_decay},
          {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=cfg.train.lr, fused=True)
steps = len(loader)
total = steps * epochs
warm = max(1, round(cfg.train.warmup_steps * total))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / (warm + 1) if s < warm else
    0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
for epoch in range(epochs):
    net.train()
    start = time.perf_counter()
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        samples += len(y)
    times.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"epoch_s": times, "samples": samples // epochs, "peak_mb": peak}))
"""


def cases(work: Path) -> dict[str, list[str]]:
    """The project's settings of each case (the loop reads the same)."""
    common = ["run.device=cpu", "run.loggers=[csv]", "run.threads=0"]
    return {
        "vision": [
            "configs/experiments/finetune_image_folder.yaml",
            "data.image_size=64",
            "data.num_workers=2",
            f"model.weights={work / 'resnet18.pth'}",
            "train.freeze_epochs=0",
            "train.backbone_lr_ratio=1.0",
            *common,
        ],
        "text": [
            "configs/experiments/hf_text_classifier.yaml",
            f"model.arch={work / 'bert'}",
            f"data.path={work / 'demo/tickets.csv'}",
            *common,
        ],
    }


def run(cmd: list, env: dict, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed:\n{done.stderr[-3000:]}")
    return done.stdout


def project_epochs(run_dir: Path) -> dict:
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("time/train_s")]
    memory = next(k for k in rows[0] if k.startswith("memory/"))
    return {
        "epoch_s": [float(r["time/train_s"]) for r in rows],
        "samples_per_s": [float(r["throughput/samples_per_s"]) for r in rows],
        "peak_mb": max(float(r[memory]) for r in rows),
    }


def after_first(times: list[float]) -> float:
    """The fastest epoch after the first (which pays for start-up): on shared cores the least
    disturbed one, so that two runs' ratio measures their code, not their neighbours."""
    return min(times[1:] or times)


def child_json(cmd: list, env: dict, cwd: Path) -> dict:
    return json.loads(run(cmd, env, cwd).strip().splitlines()[-1])


def measure(case: str, settings: list[str], ctx: dict, repeats: int, epochs: int) -> dict:
    """`repeats` pairs of the project and the loop on one case, alternating which goes first,
    then the loader alone; the figures of the module's docstring."""
    py, child, package, work = ctx["python"], ctx["child"], ctx["package"], ctx["work"]
    env, project = ctx["env"], ctx["project"]
    ratios, loops, projects = [], [], []
    for i in range(repeats):
        out = work / f"{case}{i}"
        train = [py, "scripts/train.py", "--config", settings[0], *settings[1:]]
        train += [f"train.epochs={epochs}", f"run.output_dir={out}", "run.name=r"]
        loop = [py, child, package, "loop", case, work, epochs, *settings]
        order = [("project", train), ("loop", loop)]
        for name, cmd in order if i % 2 == 0 else order[::-1]:
            if name == "loop":
                loops.append(child_json(cmd, env, project))
            else:
                run(cmd, env, project)
                projects.append(project_epochs(out / "r"))
        ratios.append(after_first(loops[-1]["epoch_s"]) / after_first(projects[-1]["epoch_s"]))
    loader = child_json([py, child, package, "loader", case, work, 2, *settings], env, project)
    rates = [s for p_ in projects for s in p_["samples_per_s"][1:] or p_["samples_per_s"]]
    loader_rate = loader["samples"] / after_first(loader["epoch_s"])
    loop_best = max(lp["samples"] / after_first(lp["epoch_s"]) for lp in loops)
    return {
        "loop_over_project": statistics.median(ratios),
        "ratios": ratios,
        "project_samples_per_s": max(rates),
        "loop_samples_per_s": loop_best,
        "loader_samples_per_s": loader_rate,
        "loader_headroom": loader_rate / max(rates),
        "fastest_loop_over_project": max(rates) / loop_best,  # as times: loop / project
        "project_peak_mb": max(p_["peak_mb"] for p_ in projects),
        "loop_peak_mb": max(lp["peak_mb"] for lp in loops),
    }


def report(case: str, r: dict) -> str:
    pairs = ", ".join(f"{x:.3f}" for x in r["ratios"])
    return (
        f"{case}: loop/project per epoch {r['loop_over_project']:.3f} (target >= 0.98; pairs "
        f"{pairs}; fastest epochs {r['fastest_loop_over_project']:.3f}) | "
        f"{r['project_samples_per_s']:.0f} samples/s (loop "
        f"{r['loop_samples_per_s']:.0f}) | loader alone {r['loader_samples_per_s']:.0f} "
        f"samples/s = {r['loader_headroom']:.1f}x training | peak RSS "
        f"{r['project_peak_mb']:.0f} MB (loop {r['loop_peak_mb']:.0f} MB)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--python", required=True, help="an environment with timm and transformers")
    p.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs (checks it runs)")
    p.add_argument("--repeats", type=int, default=3, help="pairs of each case (default 3)")
    p.add_argument("--epochs", type=int, default=6, help="epochs per run (default 6)")
    p.add_argument("--project", help="time this baked project instead of baking one")
    p.add_argument("--json", help="write the numbers to this file")
    args = p.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, args.epochs)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        work = Path(tmp)
        project, package = bake(work, args.project)
        ctx = dict(python=args.python, child=work / "child.py", package=package, work=work)
        ctx |= dict(env=_child_env(project, 2), project=project)
        ctx["child"].write_text(CHILD)
        demo = work / "demo"
        make = [args.python, "scripts/make_demo_data.py", "--out", demo, "images", "tickets"]
        run(make, ctx["env"], project)
        for case, settings in cases(work).items():
            weights = [args.python, ctx["child"], package, "weights", case, work, 0]
            run(weights, ctx["env"], project)
            settings += [f"data.root={demo / 'images'}"] if case == "vision" else []
            results[case] = measure(case, settings, ctx, repeats, epochs)
            print(report(case, results[case]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
