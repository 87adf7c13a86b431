"""The quick check (scripts/gpu_check.py --quick, make gpu-check-quick): what one short GPU
window proves first, in the order of its value, sized for about 4 minutes on one H200 with
Python's start (an estimate until a GPU measures it: the report's seconds).

quick_trace   fp32 loss trace of the default CNN, CUDA against the CPU (the oracle)
quick_twice   the same CUDA run twice: losses, final weights and last gradients bitwise
quick_resume  stopped by SIGTERM after a checkpoint and resumed: the straight run, bitwise
quick_amp     bf16 and fp16 (with its GradScaler) end near fp32, every loss finite
quick_ranks   two ranks on the GPU, one rank's global batch: one process's numbers (ranks.py)
quick_speed   the trainer against a plain loop, the LM's MFU, peak memory (speed.py)

None needs a stored number (the CPU, a second run, the straight run, fp32 and one process are
the references); goldens.py compares with stored traces on request. Each check judges by a
comparison function the test suite feeds broken input, to see it fail."""

from __future__ import annotations

import csv
import hashlib
import sys

import torch

from .common import Check, Failed, compare_states, load_last
from .numerics import amp_runs, cpu_against_here, short_on_cpu, trace
from .paths import stop_and_resume

CUDA_PEAK = "memory/cuda_peak_mb"  # metrics.csv's column: each epoch's peak on CUDA


def check_quick_trace(c: Check) -> str:
    """fp32 (TF32 off), deterministic: the default CNN's 32 per-step losses on CUDA against
    the CPU's, within 1e-3 each. Without a GPU: 16 steps on 2 CPU threads against 1 (no CUDA
    to compare; the comparison's code runs)."""
    _, line = cpu_against_here(c, *short_on_cpu(c))
    note_peak(c)
    return line


def check_quick_twice(c: Check) -> str:
    """The trace's run twice on this device: every per-step loss bitwise equal, and the
    sha256 of the final weights and of the last step's gradients."""
    threads = ["run.threads=2"] if c.machine.device == "cpu" else []
    runs = [
        fingerprint(trace(c, f"run{i}", c.machine.device, *threads, *short_on_cpu(c)))
        for i in (1, 2)
    ]
    compare_twice(*runs)
    note_peak(c)
    first = runs[0]
    return (
        f"2 runs of {len(first['losses'])} steps: losses, weights (sha256 "
        f"{first['weights'][:12]}) and last gradients ({first['grads'][:12]}) bitwise equal"
    )


def fingerprint(run: dict) -> dict:
    """A trace() run as what must repeat: its losses, the sha256 of last.pt's weights and of
    the last step's gradients."""
    weights = [run["state"]["model"][k] for k in sorted(run["state"]["model"])]
    return {"losses": run["losses"], "weights": sha256(weights), "grads": sha256(run["grads"])}


def sha256(tensors: list[torch.Tensor]) -> str:
    """The sha256 of the tensors' bytes, dtypes and shapes, in order."""
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def compare_twice(first: dict, second: dict) -> None:
    """Failed unless two fingerprints are equal: the first step whose loss differs in any
    bit, else the hash that differs."""
    a, b = first["losses"], second["losses"]
    if len(a) != len(b) or not a:
        raise Failed(f"the two runs read {len(a)} and {len(b)} losses")
    for step, (x, y) in enumerate(zip(a, b, strict=True), 1):
        if float(x).hex() != float(y).hex():
            raise Failed(f"the same run twice: step {step}'s loss {x!r} then {y!r}")
    for what, name in (("weights", "final weights"), ("grads", "last gradients")):
        if first[what] != second[what]:
            raise Failed(
                f"the same run twice: equal losses but the {name} differ (sha256 "
                f"{first[what][:12]} then {second[what][:12]})"
            )


def check_quick_resume(c: Check) -> str:
    """scripts/train.py stopped by SIGTERM after its first checkpoint, then
    train.resume=auto, against the same run straight through (deterministic): last.pt's model
    and optimizer bitwise equal."""
    # 4 epochs: the stop, sent when epoch 1's checkpoint appears, has 3 to land in. On the
    # CPU (the test suite's) a quarter of the samples and one thread: the code, not the time.
    samples = 1024 if c.machine.device == "cuda" else 256
    total = samples // 32 * 4  # TINY's batches of 32
    exact = ["run.deterministic=true", f"data.train_size={samples}", "train.epochs=4"]
    exact += ["run.threads=1"] if c.machine.device == "cpu" else []
    c.python("scripts/train.py", *c.overrides("straight", *exact))
    launch = [sys.executable, "scripts/train.py"]
    stopped = stop_and_resume(c, launch, "resumed", c.overrides("resumed", *exact), total)
    straight, resumed = load_last(c.run_dir("straight")), load_last(c.run_dir("resumed"))
    steps = straight["progress"]["step"], resumed["progress"]["step"]
    if steps[0] != steps[1]:
        raise Failed(f"the resumed run ended at step {steps[1]}, the straight one at {steps[0]}")
    count = compare_states(straight, resumed, ("model", "optimizer"))
    note_peak(c)
    return f"SIGTERM at step {stopped}, resumed to {total}: {count} entries bitwise equal"


def check_quick_amp(c: Check) -> str:
    """bf16 autocast and fp16 with its GradScaler against fp32 after the trace's steps: the
    last 4 train losses and the validation loss within 0.05 of fp32's, every loss finite
    (fp16 on CUDA only; bf16 where native)."""
    short = short_on_cpu(c)
    fp32 = trace(c, "fp32", c.machine.device, *short)
    done = amp_runs(c, fp32, *short)
    note_peak(c)
    return "; ".join(done)


def note_peak(c: Check, *more_mb: float | None) -> None:
    """figures["peak_vram_mb"]: the largest CUDA peak of the check's runs (each epoch's, in
    their metrics.csv; rank 0's under torchrun) and of `more_mb`. None on the CPU."""
    peaks = [mb for mb in more_mb if mb is not None]
    for table in sorted((c.workdir / "runs").glob("**/metrics.csv")):
        with table.open() as rows:
            peaks += [float(r[CUDA_PEAK]) for r in csv.DictReader(rows) if r.get(CUDA_PEAK)]
    if peaks:
        c.figures["peak_vram_mb"] = round(max(peaks))
