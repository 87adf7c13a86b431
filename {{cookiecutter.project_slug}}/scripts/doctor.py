"""Environment doctor: say why PyTorch or the GPU doesn't work here, and how to fix it.

One line per check: Python version and active virtual/conda env; `import torch` (in a subprocess,
so a broken CUDA install can't take the doctor down); the build (CUDA, cuDNN, MPS); the NVIDIA
driver (nvidia-smi) cross-checked against the build; a tiny GPU matmul, native bf16, NCCL and
TF32 when CUDA works; the CPU load and torch's thread count against the CPUs; the dependencies
and the project package (from .cookiecutter.json) import. This file gathers the facts (probing
the machine); doctor_checks.py turns them into the checks.

    python scripts/doctor.py [--json]     # or: make doctor.  Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The diagnosis beside this script (also where this file is loaded by its path, as tests do).
sys.path.insert(0, str(ROOT / "scripts"))

from doctor_checks import DEPS, ZOO, diagnose  # noqa: E402

TAG = "DOCTOR_JSON "

# Run in a child interpreter: a CUDA build that can't find its libraries may segfault on import.
TORCH_PROBE = r"""
import json, warnings
import torch
f = {"version": torch.__version__, "cuda": torch.version.cuda,
     "hip": getattr(torch.version, "hip", None), "cudnn": None, "mps": False}
try:
    f["cudnn"], f["mps"] = torch.backends.cudnn.version(), torch.backends.mps.is_available()
except Exception:
    pass
with warnings.catch_warnings(record=True) as caught:  # holds the reason CUDA init failed
    warnings.simplefilter("always")
    f["cuda_available"] = torch.cuda.is_available()
f["cuda_warning"] = next((str(w.message).strip().splitlines()[0] for w in caught), None)
f["threads"] = torch.get_num_threads()
if f["cuda_available"]:
    f["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    f["capability"] = list(torch.cuda.get_device_capability(0))
    f["bf16"] = torch.cuda.is_bf16_supported()  # True where bf16 is only emulated, too
    f["nccl"] = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    try:
        x = torch.randn(64, 64)
        ok = torch.allclose((x.cuda() @ x.cuda()).cpu(), x @ x, atol=0.1)
        f["matmul_error"] = None if ok else "result differs from the CPU's"
    except Exception as e:
        f["matmul_error"] = f"{type(e).__name__}: {e}".strip().splitlines()[0]
print("DOCTOR_JSON " + json.dumps(f))
"""

# Drops the working directory from sys.path: the package must be installed, not just nearby.
IMPORT_PROBE = r"""
import importlib, json, sys
sys.path = [p for p in sys.path if p not in ("", ".")]
for name in sys.argv[1:]:
    try:
        res = [name, True, str(getattr(importlib.import_module(name), "__version__", ""))]
    except BaseException as e:
        res = [name, False, f"{type(e).__name__}: {e}".strip().splitlines()[0]]
    print("DOCTOR_JSON " + json.dumps(res), flush=True)
"""


# ---- probing the outside world (tests replace these) ----


def run(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", f"{type(e).__name__}: {e}"
    return p.returncode, p.stdout, p.stderr


def tagged(out: str) -> list:
    return [json.loads(line[len(TAG) :]) for line in out.splitlines() if line.startswith(TAG)]


def probe_torch() -> dict:
    code, out, err = run([sys.executable, "-c", TORCH_PROBE], timeout=300)
    if code == 0 and tagged(out):
        return {"ok": True, **tagged(out)[0]}
    return {"ok": False, "returncode": code, "error": (err or out).strip() or "no output"}


def parse_smi(query: str, header: str) -> dict:
    rows = [[c.strip() for c in line.split(",")] for line in query.splitlines() if line.strip()]
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", header)
    gpus = [f"{r[1]} ({r[-1]})" for r in rows if len(r) >= 3]
    driver, cuda = rows[0][0] if rows else None, m.group(1) if m else None
    return {"present": True, "driver": driver, "gpus": gpus, "cuda": cuda}


def probe_nvidia_smi() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"present": False}
    fields = "--query-gpu=driver_version,name,memory.total"
    code, query, err = run(["nvidia-smi", fields, "--format=csv,noheader"], timeout=30)
    if code != 0:
        return {"present": True, "error": first_line(err or query) or f"exit code {code}"}
    return parse_smi(query, run(["nvidia-smi"], timeout=30)[1])


def probe_imports(modules: list[str]) -> dict:
    code, out, err = run([sys.executable, "-c", IMPORT_PROBE, *modules], timeout=300)
    done = {name: (ok, detail) for name, ok, detail in tagged(out)}
    # A module that killed the child (e.g. a package importing a broken torch) gets that error.
    crash = first_line(err) or f"import crashed (exit code {code})"
    return {name: done.get(name, (False, crash)) for name in modules}


def probe_python(root: Path) -> dict:
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text() if pyproject.exists() else ""
    m = re.search(r'requires-python\s*=\s*"\s*>=\s*(\d+)\.(\d+)', text)
    env = None
    if Path(sys.prefix, "conda-meta").is_dir():  # conda's base env is the one with condabin/
        base = Path(sys.prefix, "condabin").is_dir()
        env = "conda base" if base else f"conda env {Path(sys.prefix).name}"
    elif sys.prefix != sys.base_prefix:
        env = f"virtual env {sys.prefix}"
    requires = [int(m.group(1)), int(m.group(2))] if m else [3, 11]
    here = ".".join(map(str, sys.version_info[:3]))
    return {"version": here, "requires": requires, "env": env, "executable": sys.executable}


def probe_cpu() -> dict:
    """CPUs of the machine, those this process may use (affinity: taskset, cgroups, SLURM) and
    the 1-minute load average (None where the OS has none)."""
    machine = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"machine": machine, "usable": usable, "load": load}


def probe_tf32(root: Path) -> bool | None:
    """train.tf32 in the project's configs/default.yaml (None: no such file or line)."""
    path = root / "configs" / "default.yaml"
    text = path.read_text(errors="replace") if path.is_file() else ""
    m = re.search(r"^\s+tf32:\s*(true|false)\b", text, re.M)
    return m.group(1) == "true" if m else None


def gather_facts(root: Path = ROOT) -> dict:
    try:
        package = json.loads((root / ".cookiecutter.json").read_text()).get("package_name")
    except (OSError, ValueError, AttributeError):
        package = None
    names = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
    return {
        "python": probe_python(root),
        "torch": probe_torch(),
        "smi": probe_nvidia_smi(),
        "cpu": probe_cpu(),
        "env": {k: os.environ[k] for k in names if k in os.environ},
        "imports": probe_imports([*DEPS, *ZOO, *([package] if package else [])]),
        "package": package,
        "platform": sys.platform,
        "tf32": probe_tf32(root),
    }


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def parser_class() -> type[argparse.ArgumentParser]:
    """The project's parser (tools/cli.py: an argument error is one bounded line), from this
    tree whether it is installed or not; argparse's own where the package does not import,
    which is one of the things the doctor reports."""
    sys.path.insert(0, str(ROOT))
    try:
        from {{ cookiecutter.package_name }}.tools.cli import Parser
    except Exception:  # a broken package (SyntaxError, ImportError) must not stop the doctor
        return argparse.ArgumentParser
    finally:
        sys.path.remove(str(ROOT))
    return Parser


def main(argv: list[str] | None = None) -> int:
    parser = parser_class()(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--json", action="store_true", help="print a JSON list of checks")
    args = parser.parse_args(argv)
    checks = diagnose(gather_facts())
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "FAIL")}
    if args.json:
        print(json.dumps([c._asdict() for c in checks], indent=2))
    else:
        for c in checks:
            print(f"[{c.status:^4}] {c.message}")
        print(f"doctor: {counts['ok']} ok, {counts['warn']} warnings, {counts['FAIL']} failures")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
