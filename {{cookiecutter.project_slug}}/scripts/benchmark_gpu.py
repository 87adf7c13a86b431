"""Training-step speed of the model on this machine: fp32 vs bf16 autocast, eager vs
torch.compile, peak memory, and model FLOPs utilisation (MFU).

    python scripts/benchmark_gpu.py                          # the default config, on CUDA if any
    python scripts/benchmark_gpu.py --config configs/experiments/x.yaml train.batch_size=256
    python scripts/benchmark_gpu.py --dtypes fp32 bf16 --compile off on --steps 50 --json

A step is what the trainer does per batch: forward under autocast, the task's loss, backward,
gradient clipping, AdamW (fused where the trainer fuses it), zero_grad. The input is one real
training batch already on the device, so data loading is left out
(scripts/benchmark_dataloader.py measures it). Each variant gets a fresh model; its first steps
(and compilation) are timed separately as warm-up; the rate is the median of --repeats windows
of --steps steps, each closed by a device synchronize. FLOPs per step are counted once with
torch.utils.flop_counter.FlopCounterMode (matmuls and convolutions, forward + backward), and
MFU = achieved FLOP/s / the GPU's peak dense bf16 FLOP/s from PEAK_BF16_TFLOPS (n/a on CPU or an
unknown GPU; --peak-tflops sets it). fp32 uses TF32 when train.tf32 is on, as training does.
Compilation is off by default on CPU (it takes ~15 s per variant there); ask with --compile.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

try:
    from {{ cookiecutter.package_name }} import config, data, errors, models, optim, trainer
    from {{ cookiecutter.package_name }}.tools.cli import Parser
    from {{ cookiecutter.package_name }}.utils import device as devices
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

# Peak dense (no sparsity) bf16 tensor-core TFLOP/s with fp32 accumulation, from the vendor's
# data sheets. Matched in order against the whole words of torch.cuda.get_device_name()
# ("L4" is not the L40's "L40"): specific names first.
PEAK_BF16_TFLOPS = (
    ("Laptop", None),  # mobile parts share desktop names but not their clocks
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),  # SXM
    ("GH200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("RTX 4090", 165.2),
)
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def peak_tflops(device_name: str) -> float | None:
    """The table's peak for a GPU name, matching whole words: "NVIDIA A100-SXM4-80GB" is an
    A100, "NVIDIA RTX A1000" is not."""
    words = re.findall(r"[A-Za-z0-9]+", device_name)
    for key, tflops in PEAK_BF16_TFLOPS:
        key_words = key.split()
        n = len(key_words)
        if any(words[i : i + n] == key_words for i in range(len(words) - n + 1)):
            return tflops
    return None


def count_flops(model: nn.Module, task, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward + backward at this batch (fp32 eager; the count is the same math
    for bf16 and for a compiled model)."""
    with FlopCounterMode(display=False) as counter:
        task.loss(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_steps(step, device: torch.device, warmup: int, steps: int, repeats: int):
    """(seconds of the `warmup` untimed first calls, compilation included; the median
    steps/s of `repeats` windows of `steps` calls of `step`). Each window starts and ends
    with a device synchronize, so it times the work queued on the GPU, not its queueing."""
    start = time.perf_counter()
    for _ in range(warmup):
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - start
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        rates.append(steps / (time.perf_counter() - start))
    return warmup_s, statistics.median(rates)


def run_variant(cfg, task, batch_xy, device, dtype: str, compiled: bool, args) -> dict:
    torch.manual_seed(cfg.run.seed)
    x, y = (t.to(device) for t in batch_xy)
    model = models.build_model(cfg.model, batch_xy[0][:2], task.num_outputs)
    memory_format = torch.channels_last if cfg.train.channels_last else torch.preserve_format
    model.to(device, memory_format=memory_format).train()
    fused = device.type in ("cuda", "cpu")
    optimizer = optim.build_optimizer(model, cfg.train, cfg.train.lr, fused=fused)
    batch = len(x)
    if cfg.train.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    flops = count_flops(model, task, x, y)
    net = torch.compile(model) if compiled else model
    autocast = torch.autocast(device.type, DTYPES[dtype], enabled=dtype != "fp32")
    clip = cfg.train.grad_clip

    def step():
        with autocast:
            loss = task.loss(net(x), y)
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    warmup_s, steps_per_s = time_steps(step, device, args.warmup, args.steps, args.repeats)
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {
        "dtype": dtype,
        "compile": compiled,
        "samples_per_s": steps_per_s * batch,
        "ms_per_step": 1e3 / steps_per_s,
        "warmup_s": warmup_s,
        "flops_per_step": flops,
        "tflops": flops * steps_per_s / 1e12,
        "peak_memory_mb": peak_mb,
    }


def main(argv: list[str] | None = None) -> int:
    # An argument error: one bounded line
    parser = Parser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. model.width=64")
    parser.add_argument("--config", help="YAML config file (default: built-in defaults)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--compile", nargs="+", choices=["off", "on"], help="default: off on (CPU: off)"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per timed window")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per variant")
    parser.add_argument("--peak-tflops", type=float, help="peak bf16 TFLOP/s for MFU")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    args.warmup = max(args.warmup, 1)
    try:
        cfg = config.load_config(args.config, args.overrides)
        device = devices.resolve_device(cfg.run.device)
        # One real training batch, already on the device in each step: loading is left out.
        train_set, _, _, task = trainer.build_data(cfg)
        loader = data.build_loader(train_set, cfg.data, cfg.train.batch_size, True, cfg.run.seed)
        batch_xy = next(iter(loader))
    except errors.UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    devices.configure_backends(device, cfg.train.tf32, cfg.run.deterministic)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    peak = args.peak_tflops or (peak_tflops(name) if device.type == "cuda" else None)
    compiles = args.compile or (["off"] if device.type == "cpu" else ["off", "on"])
    bf16_ok = devices.native_bf16(device)  # emulated bf16 (V100, T4) measures only emulation
    rows = []
    for dtype in args.dtypes:
        for mode in compiles:
            row = {"dtype": dtype, "compile": mode == "on"}
            if dtype == "bf16" and not bf16_ok:
                row["error"] = f"bf16 is not native on {name}"
            else:
                try:
                    row = run_variant(cfg, task, batch_xy, device, dtype, mode == "on", args)
                except Exception as exc:  # one failing variant (e.g. no compiler) is reported
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                finally:
                    if mode == "on":
                        torch._dynamo.reset()  # a fresh compile cache for the next variant
            row["mfu"] = row["tflops"] / peak if peak and "tflops" in row else None
            rows.append(row)
            if not args.json:
                print(format_row(row))
    result = {
        "device": name,
        "peak_bf16_tflops": peak,
        "batch_size": cfg.train.batch_size,
        "model": cfg.model.name,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "results": rows,
    }
    ok = [r for r in rows if "error" not in r]
    if args.json:
        print(json.dumps(result, indent=2))
    elif ok:
        peak_text = f"{peak:g} TFLOP/s" if peak else "n/a (CPU, or a GPU not in PEAK_BF16_TFLOPS)"
        print(
            f"{name}, {cfg.model.name}, batch {cfg.train.batch_size}: "
            f"{ok[0]['flops_per_step'] / 1e9:.3g} GFLOP per step; peak dense bf16 {peak_text}"
        )
    return 0 if ok else 1


def format_row(row: dict) -> str:
    label = f"{row['dtype']:<4} compile {'on ' if row['compile'] else 'off'}"
    if "error" in row:
        return f"{label}  failed: {row['error']}"
    memory = (
        f"{row['peak_memory_mb']:8.0f} MB" if row["peak_memory_mb"] is not None else "n/a (CPU)"
    )
    mfu = f"{row['mfu']:6.1%}" if row["mfu"] is not None else "   n/a"
    return (
        f"{label}  {row['samples_per_s']:10.0f} samples/s  {row['ms_per_step']:8.2f} ms/step  "
        f"{row['tflops']:8.3f} TFLOP/s  MFU {mfu}  peak {memory}  warm-up {row['warmup_s']:.1f}s"
    )


if __name__ == "__main__":
    raise SystemExit(main())
