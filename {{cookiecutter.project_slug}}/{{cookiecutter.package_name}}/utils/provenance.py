"""What made a run: the code (commit, uncommitted changes), the software, the machine, the
launcher and every data file it read. Rank 0 writes it as run.json in the run folder before
the first step (diff.patch beside it when the tree is dirty) and each checkpoint's meta keeps
it; scripts/reproduce.py compares it with now and trains the run again.

Data files are hashed once: the digests are cached in <run.output_dir>/.hashes.json by path,
size and modification time, so a 10 GB table costs its hash at its first run only. A folder
(images) is one digest of its sorted (name, size, mtime) listing; run.hash_folders=true hashes
every file's bytes instead."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from .locks import replace_text
from .run_files import HASHES, PATCH, RECORD

PATCH_CAP = 2_000_000  # bytes of uncommitted diff kept; a larger one is named, not saved
UNTRACKED_SHOWN = 50  # untracked files listed (by name; never copied)
# The project's dependencies (pyproject.toml's, its extras too) where it can be read, and the
# files that pin them.
PROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
CORE = ("torch", "numpy", "pyyaml", "tqdm", "tensorboard")
PINS = ("uv.lock", "requirements.txt", "environment.yml", "pyproject.toml")
LAUNCHER_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_NNODES", "LOCAL_WORLD_SIZE")


def collect(cfg, settings: dict, world_size: int) -> tuple[dict, str]:
    """(the record, the uncommitted diff or ""): what a rerun needs to know was the same.
    `settings`: cfg as the dict config.yaml holds."""
    code, diff = code_state()
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
        "config_sha256": _sha256_text(json.dumps(settings, sort_keys=True, default=str)),
        "code": code,
        "software": software(),
        "machine": machine(),
        "launch": {"world_size": world_size, **launcher()},
        "data": data_files(cfg),
    }
    # Plain JSON values only (torch.__version__ is a str subclass): checkpoints hold the
    # record, and torch.load(weights_only=True) reads nothing else.
    return json.loads(json.dumps(record, default=str)), diff


def write(run_dir: Path, record: dict, diff: str) -> None:
    """run.json (and diff.patch when the tree is dirty), each written whole or not at all. A
    resumed run keeps the record of its first start and lists what changed at each resume."""
    path = run_dir / RECORD
    earlier = read(run_dir)
    if earlier is not None:  # each resume: when, and what differed from the first start
        changes = differences(earlier, record)
        earlier.setdefault("resumes", []).append({"at": _now(), "changes": changes})
        record = earlier
    elif diff and len(diff.encode()) <= PATCH_CAP:
        replace_text(run_dir / PATCH, diff)
    replace_text(path, json.dumps(record, indent=1, sort_keys=False) + "\n")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def read(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@functools.cache  # once per process: the code that runs is the code at its start
def code_state() -> tuple[dict, str]:
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "note": "not a git checkout"}, ""
    changed = _git("status", "--porcelain", "--untracked-files=no") or ""
    untracked = (_git("ls-files", "--others", "--exclude-standard") or "").splitlines()
    # As git prints it: a binary patch ends in a blank line that `git apply` needs.
    diff = (_git("diff", "HEAD", "--binary", strip=False) or "") if changed else ""
    code = {"commit": commit, "dirty": bool(changed), "untracked": untracked[:UNTRACKED_SHOWN]}
    if len(untracked) > UNTRACKED_SHOWN:
        code["untracked_more"] = len(untracked) - UNTRACKED_SHOWN
    if diff:
        code["diff_sha256"] = _sha256_text(diff)
        if len(diff.encode()) > PATCH_CAP:
            code["diff_note"] = f"{len(diff.encode())} bytes, over {PATCH_CAP}: not saved"
    return code, diff


def git_commit() -> str | None:
    return code_state()[0]["commit"]


def _git(*args: str, strip: bool = True) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.rstrip("\n") if strip else out.stdout


def software() -> dict:
    import torch  # here: compare_runs.py reads records without it

    versions = {}
    for name in packages():
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    pins = {name: _sha256_file(Path(name)) for name in PINS if Path(name).is_file()}
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "packages": versions,
        "pins_sha256": pins,
    }


def packages() -> list[str]:
    """The names of the project's dependencies and its extras' (not dev's tools)."""
    try:
        project = tomllib.loads(PROJECT.read_text(encoding="utf-8"))["project"]
    except (OSError, ValueError, KeyError):
        return list(CORE)
    extras = project.get("optional-dependencies", {})
    wanted = [*project.get("dependencies", [])]
    wanted += [req for name, reqs in extras.items() if name != "dev" for req in reqs]
    names = [re.match(r"[A-Za-z0-9._-]*", req).group() for req in wanted]
    return list(dict.fromkeys(name.lower() for name in names if name))


def machine() -> dict:
    import torch  # here: compare_runs.py reads records without it

    found = {"os": platform.platform(), "cpus": os.cpu_count(), "host": platform.node()}
    if torch.cuda.is_available():  # torch answers; no nvidia-smi needed
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        found["gpus"] = [f"{p.name} ({p.total_memory // 2**20} MiB)" for p in props]
        driver = Path("/proc/driver/nvidia/version")
        if driver.is_file():
            found["driver"] = driver.read_text().splitlines()[0].strip()
    return found


def launcher() -> dict:
    """torchrun's and SLURM's variables, and the CPU threads in force (float sums on the CPU
    depend on how many threads share them)."""
    import torch

    found = {name.lower(): os.environ[name] for name in LAUNCHER_VARS if name in os.environ}
    return {"threads": torch.get_num_threads(), **found}


def data_files(cfg) -> list[dict]:
    """Every file or folder the data and model settings name (paths that exist), and
    train.init_from's checkpoint, with its digest."""
    named = [value for section in (cfg.data, cfg.model) for value in _strings(section.options)]
    named += [cfg.train.init_from] if cfg.train.init_from else []
    entries = [{"path": value} for value in dict.fromkeys(named)]
    return data_now(entries, cfg.run.output_dir, cfg.run.hash_folders)


def digest(path: Path, cache: dict, content: bool = False) -> dict:
    """{path, size, mtime, sha256} of a file (cached by path, size and mtime), or of a folder:
    its listing's digest, or with `content` every file's bytes."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        lines = []
        for p in files:
            stat = p.stat()
            part = digest(p, cache)["sha256"] if content else f"{stat.st_mtime_ns}"
            lines.append(f"{p.relative_to(path).as_posix()}\t{stat.st_size}\t{part}")
        kind = "content" if content else "listing"
        return {"path": str(path), "files": len(files), kind: _sha256_text("\n".join(lines))}
    stat = path.stat()
    key = f"{path.resolve()}\t{stat.st_size}\t{stat.st_mtime_ns}"
    if key not in cache:
        cache[key], cache["_changed"] = _sha256_file(path), True
    return {"path": str(path), "size": stat.st_size, "sha256": cache[key]}


def differences(then: dict, now: dict) -> list[str]:
    """One line per difference between two records: code, software, machine, data."""
    lines = []
    a, b = then.get("code", {}), now.get("code", {})
    if a.get("commit") != b.get("commit"):
        lines.append(f"code: commit {a.get('commit')} then, {b.get('commit')} now")
    if (a.get("dirty"), a.get("diff_sha256")) != (b.get("dirty"), b.get("diff_sha256")):
        lines.append(f"code: uncommitted changes {_dirty(a)} then, {_dirty(b)} now")
    sa, sb = then.get("software", {}), now.get("software", {})
    for key in ("python", "torch", "cuda", "cudnn", "nccl"):
        if sa.get(key) != sb.get(key):
            lines.append(f"software: {key} {sa.get(key)} then, {sb.get(key)} now")
    pa, pb = sa.get("packages", {}), sb.get("packages", {})
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            lines.append(f"software: {name} {pa.get(name)} then, {pb.get(name)} now")
    la, lb = then.get("launch", {}), now.get("launch", {})
    for key in ("world_size", "threads"):
        if la.get(key) != lb.get(key):
            lines.append(f"launch: {key} {la.get(key)} then, {lb.get(key)} now")
    ma, mb = then.get("machine", {}), now.get("machine", {})
    for key in ("gpus", "driver", "cpus"):
        if ma.get(key) != mb.get(key):
            lines.append(f"machine: {key} {ma.get(key)} then, {mb.get(key)} now")
    da = {d["path"]: d for d in then.get("data", [])}
    db = {d["path"]: d for d in now.get("data", [])}
    for path in sorted(set(da) | set(db)):
        if path not in db:
            lines.append(f"data: {path} is missing now")
        elif path not in da:
            lines.append(f"data: {path} was not read then")
        elif _fingerprint(da[path]) != _fingerprint(db[path]):
            lines.append(f"data: {path} has changed (its digest differs)")
    return lines


def data_now(entries: list[dict], output_dir: str, content: bool = False) -> list[dict]:
    """The recorded data files' digests as the files are now (those that still exist)."""
    cache_path = Path(output_dir) / HASHES
    cache = _read_json(cache_path)
    found = [digest(Path(e["path"]), cache, content) for e in entries if Path(e["path"]).exists()]
    if cache.pop("_changed", False) and cache_path.parent.is_dir():
        with contextlib.suppress(OSError):  # a cache: a read-only folder only costs time
            replace_text(cache_path, json.dumps(cache), durable=False)
    return found


def _fingerprint(entry: dict) -> tuple:
    return entry.get("sha256"), entry.get("listing"), entry.get("content")


def _dirty(code: dict) -> str:
    if code.get("dirty") is None:
        return "unknown (no git)"
    return f"yes ({code.get('diff_sha256', '')[:12]})" if code.get("dirty") else "none"


def _strings(options) -> list[str]:
    values = vars(options).values() if hasattr(options, "__dict__") else ()
    out = []
    for value in values:
        out += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    return [v for v in out if v and len(v) < 4096]


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
