"""The doctor's diagnosis: pure functions from the facts that scripts/doctor.py gathers to one
line per check (ok, warn or FAIL) with its fix. Python and its env; torch's build; the NVIDIA
driver cross-checked against it, with the wheel to install; a working GPU's matmul, bf16,
NCCL and TF32; the CPUs against their load and torch's threads; the dependencies and the
project package. Tests feed it made-up facts.

No Jinja and no imports beyond the standard library: it runs wherever the doctor does.
"""

from __future__ import annotations

import re
from typing import NamedTuple

DEPS = ("numpy", "yaml", "tqdm", "tensorboard")
ZOO = ("torchvision", "timm")  # optional companions of torch: checked where installed


class Wheel(NamedTuple):
    tag: str  # the wheel index: download.pytorch.org/whl/<tag>
    cuda: tuple[int, int]  # the CUDA version torch is built with
    driver_cuda: tuple[int, int]  # the oldest driver (its nvidia-smi "CUDA Version") it is for
    driver: int  # that driver's Linux version, as the template's `compute` prompts say


# Newest first. NVIDIA's minor-version compatibility runs any CUDA 12.x build on any 12.x
# driver (>= 525.60.13 on Linux), so cu126 serves every 12.x driver; cu128 is for 12.8's own
# drivers (>= 570), the first to support Blackwell GPUs; CUDA 13.x needs >= 580.
WHEELS = (
    Wheel("cu130", (13, 0), (13, 0), 580),
    Wheel("cu128", (12, 8), (12, 8), 570),
    Wheel("cu126", (12, 6), (12, 0), 525),
)
CUDA_LIB_ERROR = re.compile(r"libc10_cuda|libcudart|libcudnn|libcublas|libnccl|undefined symbol")
INDEX = "https://download.pytorch.org/whl/"


class Check(NamedTuple):
    status: str  # "ok", "warn" or "FAIL"
    message: str


def pick(good: bool, ok_msg: str, bad_msg: str, bad: str = "warn") -> Check:
    return Check("ok", ok_msg) if good else Check(bad, bad_msg)


def version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def wheel_for(smi: dict) -> Wheel | None:
    """The newest entry of WHEELS for this driver (None: the driver must be updated)."""
    have = version(smi.get("cuda"))
    fits = [w for w in WHEELS if have is None or have >= w.driver_cuda]
    return fits[0] if fits else None


def reinstall(smi: dict) -> str:
    wheel = wheel_for(smi)
    if wheel is None:
        return f"update the NVIDIA driver to >= {WHEELS[-1].driver}"
    return f"pip install --force-reinstall torch --index-url {INDEX}{wheel.tag}"


def cuda_in_ld_path(f: dict) -> str:
    ld = f["env"].get("LD_LIBRARY_PATH", "")
    hint = f"; LD_LIBRARY_PATH={ld} points at a system CUDA: unset it"
    return hint if "cuda" in ld.lower() else ""


def diagnose_python(f: dict) -> list[Check]:
    py = f["python"]
    (major, minor), ok = py["requires"], version(py["version"]) >= tuple(py["requires"])
    msg = f"python {py['version']} (project asks >={major}.{minor})"
    checks = [pick(ok, msg, f"{msg}: recreate the env", "FAIL")]
    if py["env"] is None:
        msg = f"system interpreter ({py['executable']}): create and activate the project env"
        return checks + [Check("warn", msg)]
    if py["env"] == "conda base":
        return checks + [Check("warn", "conda base env: create a project env (see README)")]
    return checks + [Check("ok", f"inside {py['env']}")]


def diagnose_torch(f: dict) -> list[Check]:
    t = f["torch"]
    if not t["ok"]:
        err, code = t["error"], t["returncode"]
        last = err.strip().splitlines()[-1]  # the exception line, after the traceback
        if "No module named 'torch'" in err:
            return [Check("FAIL", "torch is not installed: pip install -r requirements.txt")]
        if CUDA_LIB_ERROR.search(err):
            msg = f"import torch fails ({last}): its CUDA build doesn't match the driver/libs"
            return [Check("FAIL", f"{msg}{cuda_in_ld_path(f)}; fix: {reinstall(f['smi'])}")]
        if code is None or code < 0:
            return [Check("FAIL", f"import torch crashed or hung (exit {code}): {last}")]
        return [Check("FAIL", f"import torch fails: {last}")]
    build = f"CUDA {t['cuda']}, cuDNN {t['cudnn']}" if t["cuda"] else None
    build = build or (f"ROCm {t['hip']}" if t["hip"] else "CPU build: torch.version.cuda is None")
    checks = [Check("ok", f"torch {t['version']} ({build})")]
    if f["platform"] == "darwin":
        no_mps = "MPS not available: needs Apple silicon and macOS 12.3+"
        checks.append(pick(t["mps"], "MPS (Apple GPU) available", no_mps))
    return checks


def diagnose_cuda(f: dict) -> list[Check]:
    t, smi, cvd = f["torch"], f["smi"], f["env"].get("CUDA_VISIBLE_DEVICES")
    checks, gpu = [], bool(smi["present"] and smi.get("gpus"))
    if smi["present"] and smi.get("error"):
        checks.append(Check("warn", f"nvidia-smi fails ({smi['error']}): driver not loaded?"))
    elif gpu:
        gpus = f"driver {smi['driver']}, CUDA {smi['cuda']}: {', '.join(smi['gpus'])}"
        checks.append(Check("ok", f"nvidia-smi: {gpus}"))
    if not t["ok"]:
        return checks
    if t["hip"]:
        no_gpu = "ROCm build but torch sees no AMD GPU (check rocm-smi)"
        return checks + [pick(t["cuda_available"], "ROCm GPU available", no_gpu)]
    if not t["cuda"] and gpu:
        msg = f"torch is the CPU build ({t['version']}) but an NVIDIA GPU is present"
        return checks + [Check("FAIL", f"{msg} (driver {smi['driver']}): {reinstall(smi)}")]
    if not t["cuda"]:
        return checks + [Check("ok", "no NVIDIA GPU: the CPU build is right for this machine")]
    if t["cuda_available"]:
        return checks + healthy_cuda(t, f.get("tf32"))
    if cvd is not None and cvd.strip() in ("", "-1"):
        msg = f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU from torch: unset it to use them"
        return checks + [Check("warn", msg)]
    if not smi["present"]:
        msg = "CUDA build but no NVIDIA driver (no nvidia-smi): fine on a login/CPU node"
        return checks + [Check("warn", msg)]
    why = t.get("cuda_warning") or "no reason given"
    have, need = version(smi.get("cuda")), version(t["cuda"])
    built = next((w for w in WHEELS if w.cuda == need), None)  # torch's own wheel, if listed
    floor = built.driver_cuda if built else need
    if (have and floor and have < floor) or "too old" in why:
        driver = f" to >= {built.driver}" if built else ""
        msg = f"NVIDIA driver {smi.get('driver')} is too old: it runs CUDA <= {smi.get('cuda')}"
        msg += f", torch {t['version']} needs CUDA {t['cuda']}: update the driver{driver}"
        wheel = wheel_for(smi)  # an older wheel is the alternative to a driver update
        alt = f" or {reinstall(smi)}" if wheel and need and wheel.cuda < need else ""
        return checks + [Check("FAIL", msg + alt)]
    msg = f"torch.cuda.is_available() is False with a CUDA build and a driver ({why})"
    return checks + [Check("FAIL", f"{msg}{cuda_in_ld_path(f)}; in a container pass --gpus all")]


def healthy_cuda(t: dict, tf32: bool | None = None) -> list[Check]:
    """Checks of a working CUDA build; `tf32`: the project's train.tf32 default (None:
    unknown)."""
    major, minor = t["capability"]
    name = f"{len(t['gpus'])} GPU(s), {t['gpus'][0]} (compute capability {major}.{minor})"
    checks = [Check("ok", f"CUDA works: {name}")]
    # "no kernel image is available" here means the GPU is newer than the wheel's CUDA.
    err = t["matmul_error"]
    bad = f"tiny matmul on cuda:0 failed ({err}): install a newer CUDA wheel"
    checks.append(pick(not err, "tiny matmul on cuda:0 matches the CPU", bad, "FAIL"))
    # bf16 tensor cores start with Ampere (8.0). torch.cuda.is_bf16_supported() also says True
    # on V100/T4, where bf16 is emulated and slower than fp16: the capability decides.
    emulated = " (torch emulates it, slowly)" if t["bf16"] else ""
    bf16 = f"no native bf16 on compute capability {major}.{minor}{emulated}: use "
    bf16 += "train.amp=fp16 (fp16 autocast with a GradScaler)"
    checks.append(pick(major >= 8, "native bf16: train.amp=bf16 is the fast choice", bf16))
    nccl = "NCCL not available: multi-GPU DDP needs the gloo backend"
    checks.append(pick(t["nccl"], "NCCL available (multi-GPU DDP)", nccl))
    if major >= 8:  # Ampere+: TF32 makes fp32 matmuls several times faster
        checks.append(Check("ok", f"Ampere+ GPU: {tf32_line(tf32)}"))
    return checks


def tf32_line(tf32: bool | None) -> str:
    """TF32 as training sets it: train.tf32 (utils/device.set_tf32, at the start of each run).
    A fresh process's torch.get_float32_matmul_precision() says nothing about that."""
    where = "configs/default.yaml"
    if tf32 is None:
        return f"training sets TF32 for fp32 matmuls and convolutions by train.tf32 ({where})"
    if tf32:
        return (
            f"training uses TF32 for fp32 matmuls and convolutions (train.tf32: true in {where}; "
            "train.tf32=false computes in full fp32)"
        )
    return (
        f"training computes fp32 matmuls in full fp32 (train.tf32: false in {where}); "
        "train.tf32=true uses TF32, several times faster"
    )


def diagnose_cpu(f: dict) -> list[Check]:
    """Oversubscribed CPUs make CPU training several times slower, and nothing else says so."""
    cpu, threads = f["cpu"], f["torch"].get("threads")
    usable, machine, load = cpu["usable"], cpu["machine"], cpu["load"]
    checks = []
    if threads:
        msg = f"torch uses {threads} CPU threads per process; {usable} CPUs usable here"
        fix = f"{msg}: threads beyond the CPUs wait on each other; set run.threads={usable}"
        checks.append(pick(threads <= usable, msg, fix))
    if load is not None:
        # The load average counts the runnable tasks of the whole machine, so it is measured
        # against all its CPUs; the usable ones are named because they are what a run gets.
        msg = f"load {load:.1f} (1-minute average) on {machine} CPUs ({usable} usable here)"
        fix = f"{msg}: the CPUs are oversubscribed and CPU training runs several times slower; "
        fix += "use run.threads=1 per process, or run fewer jobs in parallel"
        checks.append(pick(load <= machine, msg, fix))
    return checks


def diagnose_deps(f: dict) -> list[Check]:
    checks = []
    for name in DEPS:
        ok, detail = f["imports"][name]
        fix = f"{name} missing ({detail}): pip install -r requirements.txt"
        checks.append(pick(ok, f"{name} {detail}".strip(), fix))
    pkg = f["package"]
    if pkg is None:
        return checks + [Check("warn", "no package_name in .cookiecutter.json: package unchecked")]
    ok, detail = f["imports"][pkg]
    fix = f"package {pkg} not importable ({detail}): pip install -e ."
    return checks + [pick(ok, f"package {pkg} imports", fix, "FAIL")]


def diagnose_zoo(f: dict) -> list[Check]:
    """torchvision is built for one torch release (0.(N+15) for 2.N): another pair fails at
    import ("operator torchvision::nms does not exist") or at the first image op. timm
    imports torchvision. Not installed is fine: the project's core needs neither."""
    imports, torch = f["imports"], f["torch"]
    ok, detail = imports.get("torchvision", (False, "ModuleNotFoundError"))
    if not torch["ok"] or (not ok and detail.startswith("ModuleNotFoundError")):
        return []  # a broken torch is the check above; a missing torchvision is fine
    have = version(torch.get("version"))
    want = f"0.{have[1] + 15}" if have and have[0] == 2 else None
    pair = f"torch=={torch.get('version', '?').split('+')[0]} torchvision" + (
        f"=={want}.*" if want else ""
    )
    fix = f"install the pair in one command from torch's index: pip install '{pair}'"
    if not ok:
        return [Check("FAIL", f"torchvision does not import ({detail}): {fix}")]
    got = version(detail)
    matched = want is None or (got is not None and f"{got[0]}.{got[1]}" == want)
    msg = f"torchvision {detail} (torch {torch.get('version')} wants {want or 'its own'}.x)"
    checks = [pick(matched, msg, f"{msg}: {fix}", "FAIL")]
    ok, detail = imports.get("timm", (False, "ModuleNotFoundError"))
    if not detail.startswith("ModuleNotFoundError"):
        checks.append(pick(ok, f"timm {detail}", f"timm does not import ({detail}): {fix}"))
    return checks


def diagnose(f: dict) -> list[Check]:
    checks = diagnose_python(f) + diagnose_torch(f) + diagnose_cuda(f)
    return checks + diagnose_cpu(f) + diagnose_deps(f) + diagnose_zoo(f)
