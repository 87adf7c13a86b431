"""Speed against its ceiling, each figure a ratio of two measurements taken in the same
process: a GEMM-bound language model of about 100M parameters (the project's transformer on
synthetic tokens) in bf16 against TF32, its MFU against the GPU's peak, torch.compile against
eager; the default CNN through the trainer against a plain loop over the same model and
loader; the loader (pinned memory, 2 workers) against the training step.

Timed as scripts/benchmark_gpu.py times: warm-up steps untimed (compilation reported apart),
a synchronize around each timed window, the median of several windows. Without a GPU the
same code runs at toy sizes and no target is judged."""

from __future__ import annotations

import csv
import statistics
import time
from types import SimpleNamespace

import benchmark_dataloader
import benchmark_gpu
import torch
from torch import nn

from {{ cookiecutter.package_name }} import data, models, optim, trainer
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.models.transformer import Transformer
from {{ cookiecutter.package_name }}.tasks.language_model import LanguageModel
from {{ cookiecutter.package_name }}.utils import device as devices

from .common import Check
from .quick import note_peak

# ~109M parameters (6 blocks of 12.6M, a 32768 x 1024 tied embedding); 16 x 1024 tokens a
# step: ~12 TFLOP, ~30 ms in bf16 on an H200. The CPU sizes only run the code.
LM = {
    "cuda": dict(width=1024, depth=6, heads=16, vocab=32768, seq_len=1024, batch=16),
    "cpu": dict(width=32, depth=2, heads=2, vocab=128, seq_len=32, batch=4),
}
TIMING = {"cuda": dict(warmup=3, steps=5, repeats=3), "cpu": dict(warmup=1, steps=2, repeats=2)}
STEP_TIMING = {"cuda": dict(warmup=10, steps=50, repeats=3), "cpu": TIMING["cpu"]}
BF16_OVER_TF32 = 1.3
MFU_GOAL = 0.30  # nanochat reports 41%, torchtitan 33-39% on H100-class GPUs
COMPILE_OVER_EAGER = 1.1
TRAINER_OVER_LOOP = 0.98
LOADER_OVER_STEP = 1.0  # the loader must not be the bottleneck
# The quick check's: 2 timed epochs of 128 steps are noisier than speed_cnn's 3 of 256; and a
# floor of MFU without compile, below which bf16 is not on the tensor cores (fp32 without TF32
# reaches ~7% of an H100's bf16 peak).
QUICK_TRAINER_OVER_LOOP = 0.9
QUICK_MFU_FLOOR = 0.15


def check_speed_lm(c: Check) -> str:
    """A ~100M-parameter transformer LM: bf16 against TF32 (>= 1.3x), MFU against the GPU's
    peak dense bf16 FLOP/s (>= 30%), torch.compile against eager in bf16 (>= 1.1x, compile
    time reported apart)."""
    lm = lm_setup(c)
    rows = {"tf32": lm_rate(c, lm, lm.model, "off"), "bf16": lm_rate(c, lm, lm.model, "bf16")}
    if c.machine.device == "cuda":  # compiling takes minutes on a CPU
        rows["bf16+compile"] = lm_rate(c, lm, torch.compile(lm.model), "bf16")
    for name, row in rows.items():
        c.figures.update({f"lm_{name}_{k}": v for k, v in row.items()})
    bf16 = rows["bf16"]["steps_per_s"] / rows["tf32"]["steps_per_s"]
    c.target("LM bf16 vs TF32 steps/s", bf16, BF16_OVER_TF32)
    done = [f"{lm.params / 1e6:.0f}M params, {lm.flops / 1e12:.2f} TFLOP/step"]
    done.append(f"bf16/TF32 {bf16:.2f}x")
    if "bf16+compile" in rows:
        ratio = rows["bf16+compile"]["steps_per_s"] / rows["bf16"]["steps_per_s"]
        c.target("LM compiled vs eager (bf16) steps/s", ratio, COMPILE_OVER_EAGER)
        warm = rows["bf16+compile"]["warmup_s"]
        done.append(f"compiled/eager {ratio:.2f}x (compile {warm:.0f}s, untimed)")
    if lm.peak:
        c.figures["mfu"] = mfu = max(row["tflops"] for row in rows.values()) / lm.peak
        c.target("LM MFU (best variant)", mfu, MFU_GOAL)
        done.append(f"MFU {mfu:.1%} of {lm.peak:g} TFLOP/s")
    return "; ".join(done)


def lm_setup(c: Check) -> SimpleNamespace:
    """The LM at this device's size (LM), its task, a synthetic batch (x, y), fused AdamW, its
    FLOPs a step and the GPU's peak dense bf16 TFLOP/s (None on the CPU or a GPU not in
    benchmark_gpu's table), noted in the figures."""
    device, size = devices.resolve_device(c.machine.device), LM[c.machine.device]  # cuda:0
    devices.configure_backends(device, tf32=True, deterministic=False)  # as training sets it
    opts = Transformer.Options(size["width"], size["depth"], size["heads"], 0.0, size["seq_len"])
    with device:
        model = Transformer((size["seq_len"],), size["vocab"], opts)
    task = LanguageModel(LanguageModel.Options(), SimpleNamespace(vocab_size=size["vocab"]))
    g = torch.Generator().manual_seed(0)  # on the CPU: randint's default device
    tokens = torch.randint(size["vocab"], (size["batch"], size["seq_len"] + 1), generator=g)
    x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    optimizer = optim.build_optimizer(model, load_config(None, []).train, 1e-4, fused=True)
    flops = benchmark_gpu.count_flops(model, task, x, y)
    peak = benchmark_gpu.peak_tflops(c.machine.name) if c.machine.device == "cuda" else None
    params = sum(p.numel() for p in model.parameters())
    c.figures.update(lm_params=params, lm_tokens_per_step=x.numel(), lm_flops_per_step=flops)
    c.figures["peak_bf16_tflops"] = peak
    parts = dict(model=model, task=task, optimizer=optimizer, x=x, y=y)
    return SimpleNamespace(**parts, flops=flops, peak=peak, params=params)


def lm_rate(c: Check, lm: SimpleNamespace, net, amp: str) -> dict:
    """Steps/s, TFLOP/s, warm-up seconds and peak memory of training steps of `net` (lm.model
    or its compiled form) on lm's batch."""
    model, task, optimizer, x, y = lm.model, lm.task, lm.optimizer, lm.x, lm.y
    device = x.device

    def step():
        with devices.autocast(device, amp):
            loss = task.loss(net(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    warmup_s, rate = benchmark_gpu.time_steps(step, device, **TIMING[c.machine.device])
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    tflops = lm.flops * rate / 1e12
    return {"steps_per_s": rate, "tflops": tflops, "warmup_s": warmup_s, "peak_mb": peak_mb}


def cnn_settings(c: Check, samples: int = 16384, epochs: int = 4) -> list[str]:
    """The default config, with epochs long enough to time: `epochs` of `samples` (batches
    of 64; 4 of 256 steps by default) on CUDA; 2 of 4 steps on the CPU."""
    cuda = c.machine.device == "cuda"
    samples, epochs = (samples, epochs) if cuda else (256, 2)
    sizes = [f"data.train_size={samples}", f"train.epochs={epochs}"]
    runs = c.workdir / "runs"
    return [*sizes, "data.val_size=256", "run.loggers=[csv]", f"run.output_dir={runs}"]


def check_speed_cnn(c: Check) -> str:
    """The default CNN: the trainer's samples/s against a plain loop over the same model,
    optimizer and loader (>= 0.98x); the loader with pinned memory and 2 workers against the
    training step on a batch already on the GPU (>= 1x: not the bottleneck)."""
    settings = [*cnn_settings(c), f"run.device={c.machine.device}"]
    cfg = load_config(None, settings)
    fit_rate = trainer_rate(c, settings)
    loop_rate, step_rate = plain_loop(cfg, devices.resolve_device(c.machine.device))
    train_set = trainer.build_data(cfg)[0]
    cuda = c.machine.device == "cuda"
    batches = (
        dict(batches=200, warmup=5, repeats=3) if cuda else dict(batches=4, warmup=1, repeats=2)
    )
    loaders = {
        w: benchmark_dataloader.measure(train_set, cfg, w, pin=cuda, **batches)["samples_per_s"]
        for w in (0, 2)
    }
    c.figures.update(trainer_samples_per_s=fit_rate, loop_samples_per_s=loop_rate)
    c.figures.update(step_samples_per_s=step_rate, loader_samples_per_s=loaders)
    c.figures["trainer_vs_loop"] = fit_rate / loop_rate
    c.target("CNN trainer vs plain loop samples/s", fit_rate / loop_rate, TRAINER_OVER_LOOP)
    c.target(
        "loader (2 workers, pinned) vs step samples/s", loaders[2] / step_rate, LOADER_OVER_STEP
    )
    return (
        f"trainer {fit_rate:.0f}/s, plain loop {loop_rate:.0f}/s ({fit_rate / loop_rate:.3f}x); "
        f"step alone {step_rate:.0f}/s; loader {loaders[2]:.0f}/s with 2 workers, "
        f"{loaders[0]:.0f}/s with none"
    )


def trainer_rate(c: Check, settings: list[str]) -> float:
    """The trainer's samples/s (metrics.csv), median over the epochs after the first."""
    trainer.fit(load_config(None, [*settings, "run.name=trainer"]))
    with (c.workdir / "runs" / "trainer" / "metrics.csv").open() as rows:
        rates = [float(r["throughput/samples_per_s"]) for r in csv.DictReader(rows)]
    return statistics.median(rates[1:] or rates)


def plain_loop(cfg, device: torch.device) -> tuple[float, float]:
    """(samples/s of a hand-written loop over the trainer's model, optimizer, schedule and
    loader, median over the epochs after the first; samples/s of the same step on one batch
    already on the device)."""
    train_set, _, _, task = trainer.build_data(cfg)
    pin = cfg.data.pin_memory and device.type == "cuda"
    loader = data.build_loader(
        train_set, cfg.data, cfg.train.batch_size, True, cfg.run.seed, pin_memory=pin
    )
    model = models.build_model(cfg.model, data.example_inputs(train_set), task.num_outputs)
    model.to(device).train()
    optimizer = optim.build_optimizer(model, cfg.train, cfg.train.lr, fused=True)
    scheduler = optim.build_scheduler(optimizer, cfg.train, len(loader) * cfg.train.epochs)
    devices.configure_backends(device, cfg.train.tf32, cfg.run.deterministic)

    def step(x, y):
        loss = task.loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    rates = []
    for epoch in range(cfg.train.epochs):
        data.set_epoch(loader, epoch)
        start, seen = time.perf_counter(), 0
        for x, y in loader:
            step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            seen += len(y)
        benchmark_gpu.synchronize(device)
        rates.append(seen / (time.perf_counter() - start))
    x, y = (t.to(device) for t in next(iter(loader)))
    data.close_loader(loader)
    _, rate = benchmark_gpu.time_steps(lambda: step(x, y), device, **STEP_TIMING[device.type])
    return statistics.median(rates[1:] or rates), rate * len(y)


def check_quick_speed(c: Check) -> str:
    """One line of speed, warm-up untimed and reported apart, no compile (minutes: speed_lm
    compiles): the default CNN's samples/s through the trainer against a plain loop over the
    same model and loader (>= 0.9x), the ~100M-parameter LM's MFU in bf16 against the GPU's
    peak (>= 15%), the peak CUDA memory."""
    settings = [*cnn_settings(c, samples=8192, epochs=3), f"run.device={c.machine.device}"]
    fit_rate = trainer_rate(c, settings)
    device = devices.resolve_device(c.machine.device)
    loop_rate = plain_loop(load_config(None, settings), device)[0]
    lm = lm_setup(c)
    row = lm_rate(c, lm, lm.model, "bf16")
    ratio, mfu = fit_rate / loop_rate, row["tflops"] / lm.peak if lm.peak else None
    c.figures.update(trainer_samples_per_s=fit_rate, loop_samples_per_s=loop_rate)
    c.figures.update(trainer_vs_loop=ratio, mfu=mfu, lm_bf16_tflops=row["tflops"])
    c.figures["lm_bf16_warmup_s"] = row["warmup_s"]
    c.target("CNN trainer vs plain loop samples/s (quick)", ratio, QUICK_TRAINER_OVER_LOOP)
    if mfu is not None:
        c.target("LM MFU, bf16 eager (quick)", mfu, QUICK_MFU_FLOOR)
    note_peak(c, row["peak_mb"])
    mfu_line = f"MFU {mfu:.1%} of {lm.peak:g} TFLOP/s" if mfu is not None else "MFU n/a here"
    peak_mb = c.figures.get("peak_vram_mb")
    return (
        f"trainer {fit_rate:.0f}/s vs plain loop {loop_rate:.0f}/s ({ratio:.3f}x); LM bf16 "
        f"{row['tflops']:.2f} TFLOP/s, {mfu_line} (warm-up {row['warmup_s']:.1f}s untimed, "
        f"no compile); peak memory {f'{peak_mb} MB' if peak_mb is not None else 'n/a (CPU)'}"
    )
