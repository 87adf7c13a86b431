"""Numbers, not only "it ran": a short fp32 run gives the same loss trace on the CPU and on
CUDA; bf16 and fp16 end near fp32; TF32 is on or off as train.tf32 says; SyncBatchNorm on two
ranks equals BatchNorm on the whole batch.

The training runs are fit() calls in a worker process (scripts/gpu_check.py --worker), their
per-step losses read where the loop reads them. The SyncBatchNorm ranks are this module run by
torchrun: python -m torch.distributed.run --nproc_per_node=2 -m gpu_checks.numerics syncbn OUT
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from {{ cookiecutter.package_name }} import distributed, loop, parallel
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import device as devices

from .common import TINY, Check, Failed, load_last

# 32 steps (2 epochs of TINY), each loss read; deterministic kernels, full fp32 (no TF32), no
# dropout (its masks come from each device's own random generator).
TRACE = [
    *(a for a in TINY if not a.startswith("run.log_every")),
    "run.log_every=1",
    "run.deterministic=true",
    "train.tf32=false",
    "model.dropout=0",
]
# Measured on the CPU: 1 against 2 threads differ by 1e-7 at most over the 32 steps, bf16
# autocast by 7e-3 (5e-4 at the end). A CUDA trace within 1e-3 of the CPU's is fp32 on both;
# one off by bf16's distance is not. Mixed precision must end within 0.05 of fp32's loss.
TRACE_TOLERANCE = 1e-3
AMP_TOLERANCE = 0.05
SYNCBN_TOLERANCE = 1e-5  # max |diff| relative to the largest value: fp32 rounding only


def trace(c: Check, name: str, device: str, *more: str) -> dict:
    """fit() of the TRACE run `name` on `device`: its per-step losses, final validation loss,
    last.pt and the gradients of its last step (as the optimizer took them: clipped)."""
    losses: list[float] = []
    grads: list[torch.Tensor] = []
    read, clip = loop.read_losses, parallel.clip_grad_norm_

    def recording(run, *args):
        mean, stop = read(run, *args)
        losses.append(mean)  # one step per read: run.log_every=1
        return mean, stop

    def clipping(params, max_norm):
        norm = clip(params, max_norm)
        grads[:] = [p.grad.detach().clone() for p in params if p.grad is not None]
        return norm

    runs = c.workdir / "runs"
    overrides = [*TRACE, f"run.device={device}", f"run.output_dir={runs}", f"run.name={name}"]
    loop.read_losses, parallel.clip_grad_norm_ = recording, clipping
    try:
        result = fit(load_config(None, [*overrides, *more]))
    finally:
        loop.read_losses, parallel.clip_grad_norm_ = read, clip
    state = load_last(runs / name)
    return {"losses": losses, "val": result["metrics"]["loss"], "state": state, "grads": grads}


def check_numerics(c: Check) -> str:
    """fp32 loss trace, CPU against CUDA (32 steps, deterministic, TF32 off); bf16 and fp16
    against fp32 after those steps (fp16 saving its GradScaler, bf16 none); TF32 on and off as
    train.tf32 sets it. Without a GPU the second trace runs on 2 CPU threads, 16 steps."""
    short = short_on_cpu(c)
    fp32, line = cpu_against_here(c, *short)
    return "; ".join([line, *amp_runs(c, fp32, *short), tf32_flags(c)])


def short_on_cpu(c: Check) -> list[str]:
    """Without a GPU, one epoch (16 steps): the test suite runs the checks there, for their
    code."""
    return ["train.epochs=1"] if c.machine.device == "cpu" else []


def cpu_against_here(c: Check, *more: str) -> tuple[dict, str]:
    """The TRACE run on the CPU (1 thread, the oracle) and on this device, compared step by
    step (compare_trace): (this device's run, a detail line). Without a GPU there is no CUDA
    to compare: the second run is on 2 CPU threads, which proves the comparison's code only."""
    device = c.machine.device
    reference = trace(c, "fp32_cpu", "cpu", "run.threads=1", *more)
    here = ["run.threads=2"] if device == "cpu" else []
    other = trace(c, "fp32", device, *here, *more)
    steps = len(other["losses"])
    c.figures.update(trace_steps=steps, trace_cpu=reference["losses"])
    c.figures["trace_device"] = other["losses"]  # what --export-goldens writes
    c.figures["trace_settings"] = [*TRACE, f"run.device={device}", *here, *more]
    gap = compare_trace(c, reference["losses"], other["losses"], f"CPU vs {device}")
    line = f"fp32 trace cpu vs {device}: max |diff| {gap:.1e} over {steps} steps"
    return other, line + (" (no GPU: 1 CPU thread against 2)" if device == "cpu" else "")


def amp_runs(c: Check, fp32: dict, *more: str) -> list[str]:
    """bf16 (where native) and fp16 (on CUDA) against the fp32 run `fp32`: a line each."""
    done = []
    for amp in ("bf16", "fp16"):
        if amp == "fp16" and c.machine.device != "cuda":
            done.append("fp16: CUDA only")
        elif amp == "bf16" and not c.machine.native_bf16:
            done.append("bf16: not native here")
        else:
            done.append(mixed_precision(c, amp, fp32, *more))
    return done


def compare_trace(c: Check, reference: list[float], other: list[float], what: str) -> float:
    """The largest |diff| of two per-step loss traces (`what` names them: "CPU vs cuda"), a
    target judged on every device; Failed naming the first step off by more than
    TRACE_TOLERANCE, or if the traces differ in length or hold a loss that is not finite."""
    if len(reference) != len(other) or not reference:
        raise Failed(f"fp32 loss trace {what}: {len(reference)} against {len(other)} steps")
    gaps = [abs(a - b) for a, b in zip(reference, other, strict=True)]
    gap = max(gaps) if all(math.isfinite(g) for g in gaps) else math.inf
    c.target(f"fp32 loss trace {what}, max |diff|", gap, TRACE_TOLERANCE, True, True)
    if not gap <= TRACE_TOLERANCE:
        i = next(i for i, g in enumerate(gaps) if not g <= TRACE_TOLERANCE)
        raise Failed(
            f"fp32 loss trace {what}: step {i + 1} {reference[i]:.6f} vs {other[i]:.6f} "
            f"(|diff| {gaps[i]:.1e}, at most {TRACE_TOLERANCE:g})"
        )
    return gap


def mixed_precision(c: Check, amp: str, fp32: dict, *more: str) -> str:
    """The `amp` run against `fp32`: final train and validation losses within AMP_TOLERANCE
    (judge_amp); a GradScaler state with fp16 only."""
    run = trace(c, amp, c.machine.device, f"train.amp={amp}", *more)
    end, val = judge_amp(c, amp, fp32, run)
    scaler = run["state"]["scaler"]
    if bool(scaler) != (amp == "fp16"):
        raise Failed(f"GradScaler {'on' if scaler else 'off'} with train.amp={amp}")
    scale = f", loss scale {scaler['scale']:g}" if scaler else ""
    return f"{amp}: final loss {end:.1e} from fp32's, val {val:.1e}{scale}"


def judge_amp(c: Check, amp: str, fp32: dict, run: dict) -> tuple[float, float]:
    """(|diff| of the mean of the last 4 train losses, |diff| of the validation loss) of the
    `amp` run against fp32's, each a target; Failed if a loss is not finite or a difference
    is over AMP_TOLERANCE."""
    losses = [*run["losses"], run["val"]]
    if not losses[:-1] or not all(math.isfinite(x) for x in losses):
        raise Failed(f"{amp}: a loss is not finite (or none was read): {losses[-5:]}")
    end = abs(statistics.mean(run["losses"][-4:]) - statistics.mean(fp32["losses"][-4:]))
    val = abs(run["val"] - fp32["val"])
    c.figures[f"{amp}_train_loss_diff"], c.figures[f"{amp}_val_loss_diff"] = end, val
    c.target(f"{amp} vs fp32, |last 4 train losses diff|", end, AMP_TOLERANCE, True, True)
    c.target(f"{amp} vs fp32, |val loss diff|", val, AMP_TOLERANCE, True, True)
    if not max(end, val) <= AMP_TOLERANCE:
        raise Failed(
            f"{amp} ends {end:.2e} (train) and {val:.2e} (val) from fp32's loss: over "
            f"{AMP_TOLERANCE:g}"
        )
    return end, val


def tf32_flags(c: Check) -> str:
    """set_tf32 (what train.tf32 calls) off, then on: the flags of both of torch's APIs agree
    and nothing warns; on CUDA a matmul and a convolution round as TF32 (error ~1e-3) or as
    IEEE fp32 (~1e-6), as asked."""
    errors = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for enabled in (False, True):  # ends on, the default
            devices.set_tf32(enabled)
            try:
                legacy = (
                    torch.get_float32_matmul_precision(),
                    torch.backends.cuda.matmul.allow_tf32,
                    torch.backends.cudnn.allow_tf32,
                )
            except RuntimeError as exc:
                raise Failed(f"set_tf32({enabled}) left torch's TF32 flags mixed: {exc}") from exc
            if legacy != (("high", True, True) if enabled else ("highest", False, False)):
                raise Failed(f"set_tf32({enabled}): the legacy flags read {legacy}")
            if c.machine.device == "cuda":
                errors[enabled] = rounding_errors()
    if caught:
        raise Failed(f"set_tf32 warned: {caught[0].message}")
    if not errors:
        return "TF32 flags: both APIs agree, no warning"
    (tf_mm, tf_conv), (ieee_mm, ieee_conv) = errors[True], errors[False]
    c.figures.update(tf32_errors=errors[True], ieee_errors=errors[False])
    # TF32 keeps 10 of fp32's 23 mantissa bits: its matmul errs by ~5e-4 of the largest
    # value, IEEE fp32 by ~1e-7. cuDNN may pick a Winograd convolution, whose IEEE error is
    # larger, so the convolution's TF32 error is compared with its IEEE one.
    c.target("TF32 matmul relative error", tf_mm, 1e-4)
    c.target("IEEE fp32 matmul relative error", ieee_mm, 1e-5, at_most=True)
    c.target("convolution error, TF32 over IEEE", tf_conv / max(ieee_conv, 1e-12), 4.0)
    return f"TF32 error {tf_mm:.0e}/{tf_conv:.0e}, IEEE {ieee_mm:.0e}/{ieee_conv:.0e} (mm/conv)"


def rounding_errors() -> tuple[float, float]:
    """Max relative error of an fp32 matmul and convolution on CUDA against float64."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(1024, 1024, device="cuda", generator=g) for _ in range(2))
    x = torch.randn(8, 64, 32, 32, device="cuda", generator=g)
    w = torch.randn(64, 64, 3, 3, device="cuda", generator=g)
    mm = relative((a @ b).double(), a.double() @ b.double())
    conv = torch.nn.functional.conv2d
    return mm, relative(conv(x, w).double(), conv(x.double(), w.double()))


def relative(value: torch.Tensor, exact: torch.Tensor) -> float:
    return ((value - exact).abs().max() / exact.abs().max().clamp_min(1e-12)).item()


def syncbn_ranks(out: Path, device_name: str = "cuda") -> None:
    """One rank of the SyncBatchNorm check: the same batch on every rank (one seed), each
    normalising its half with SyncBatchNorm; rank 0 also runs BatchNorm on the whole batch and
    writes the largest differences to `out`. On the CPU, which has no SyncBatchNorm, each rank
    normalises its half with plain BatchNorm: the test suite's proof that the comparison sees
    statistics that were not synchronised."""
    info, device = distributed.setup(device_name)
    try:
        torch.manual_seed(0)
        x, grad = torch.randn(2, 8, 4, 5, 5, device=device).unbind()  # (N, C, H, W) each
        whole = nn.BatchNorm2d(4).to(device)
        with torch.no_grad():
            whole.weight.uniform_(0.5, 1.5)
            whole.bias.uniform_(-0.5, 0.5)
        synced = copy.deepcopy(whole)
        if device.type == "cuda":
            synced = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(synced))[0]
        half = slice(info.rank * 4, (info.rank + 1) * 4)
        mine = x[half].clone().requires_grad_()
        y = synced(mine)
        (y * grad[half]).sum().backward()
        parts = distributed.all_gather_object((y.detach().cpu(), mine.grad.cpu()))
        weight_grad = distributed.all_reduce_sum(synced.weight.grad.clone())
        bias_grad = distributed.all_reduce_sum(synced.bias.grad.clone())
        if info.is_main:
            full = x.clone().requires_grad_()
            expected = whole(full)
            (expected * grad).sum().backward()
            pairs = {
                "output": (torch.cat([p[0] for p in parts]), expected.detach()),
                "input grad": (torch.cat([p[1] for p in parts]), full.grad),
                "weight grad": (weight_grad, whole.weight.grad),
                "bias grad": (bias_grad, whole.bias.grad),
                "running mean": (synced.running_mean, whole.running_mean),
                "running var": (synced.running_var, whole.running_var),
            }
            diffs = {
                k: relative(a.double().cpu(), b.double().cpu()) for k, (a, b) in pairs.items()
            }
            out.write_text(json.dumps({"ranks": info.world_size, "diffs": diffs}))
    finally:
        distributed.teardown()


def judge_syncbn(c: Check, result: Path) -> str:
    """The targets of the ranks' differences (syncbn_ranks)."""
    done = json.loads(result.read_text())
    for name, diff in done["diffs"].items():
        c.target(f"SyncBatchNorm vs BatchNorm, {name}", diff, SYNCBN_TOLERANCE, True)
    worst = max(done["diffs"], key=done["diffs"].get)
    diff = done["diffs"][worst]
    return f"{done['ranks']} ranks equal BatchNorm on the whole batch (worst: {worst} {diff:.0e})"


if __name__ == "__main__" and sys.argv[1:2] == ["syncbn"]:
    syncbn_ranks(Path(sys.argv[2]), *sys.argv[3:4])
