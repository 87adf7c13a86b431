"""Fixtures that shrink the real config to seconds on CPU: tiny data, tiny model, tmp output."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# hypothesis keeps its example database and a cache of constants in .hypothesis/ of the folder
# the tests run in: outside the project, so that the tests leave nothing in it.
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / f"hypothesis-{os.getuid()}")
)

# What needs torch >= 2.7 is refused below it, on the floor (2.6), with one line
# (test_torch_floor.py), and the tests that run it skip.
NEEDS_TORCH_2_7 = pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 7),
    reason="needs torch >= 2.7: refused below it (test_torch_floor.py)",
)

# Small enough for a CPU step in milliseconds, big enough to learn something.
TINY = [
    "data.train_size=256",
    "data.val_size=96",
    "data.image_size=8",
    "data.num_classes=4",
    "model.width=8",
    "train.batch_size=16",
    "train.epochs=2",
    "train.warmup_steps=2",
    "run.log_every=4",
    "run.loggers=[csv]",
    "run.device=cpu",
]


def pytest_configure(config):
    # torch.compile imports torch._inductor, which imports torch.utils.mkldnn, whose classes
    # use the deprecated torch.jit.script_method at import time: 14 warnings from torch itself
    # in any test that compiles. Only that warning, only from torch.jit's own module.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:`torch.jit.script_method` is:DeprecationWarning:torch.jit._script",
    )
    # A shell starts a background job (`make test-all &`, nohup) with SIGINT ignored, and
    # every child inherits that: the ctrl-c tests would send a SIGINT nothing sees. A handler
    # here is reset to the default in each child at exec.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def tiny_with(tiny: list[str], *extra: str) -> list[str]:
    """`tiny` plus `extra`; where `extra` chooses another dataset, model or task, without
    tiny's options that the new choice does not have (they would be refused)."""
    from {{ cookiecutter.package_name }} import config

    chosen = dict(a.split("=", 1) for a in extra if a.split("=")[0].endswith(".name"))
    kept = []
    for arg in tiny:
        section, _, key = arg.split("=")[0].partition(".")
        name = chosen.get(f"{section}.name")
        if section in config.COMPONENTS and name in config.components(section):
            common = {f.name for f in dataclasses.fields(config.SECTIONS[section])}
            own = {f.name for f in dataclasses.fields(config.options_type(section, name))}
            if key not in common | own:
                continue
        kept.append(arg)
    return kept + list(extra)


# >>> text
def lm_overrides(tmp_path: Path, path: Path) -> list[str]:
    """A tiny character language model on the text file `path`, writing under tmp_path."""
    return [
        *("data.name=text", f"data.path={path}", "data.seq_len=16"),
        "model.name=transformer",
        "model.width=16",
        "model.depth=1",
        "model.heads=2",
        "model.max_len=16",
        "task.name=language_model",
        "train.batch_size=4",
        "train.epochs=1",
        "train.warmup_steps=1",
        "run.loggers=csv",
        "run.device=cpu",
        f"run.output_dir={tmp_path / 'runs'}",
    ]
# <<< text


# What a test session may leave in the project: caches and environments. data/ and
# checkpoints/ are compared by their entries only (a user's datasets can be large).
CACHES = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".venv", ".conda-env"}


def project_files(root: Path = ROOT) -> set[str]:
    """The project's files (data/ and checkpoints/: their entries), as paths from `root`."""
    found = set()
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if d not in CACHES and not d.endswith(".egg-info")]
        if len(rel.parts) >= 2 and rel.parts[0] in ("data", "checkpoints"):
            found.add(str(Path(*rel.parts[:2])))  # an entry of data/ or checkpoints/
            dirs[:] = []  # not walked
            continue
        found |= {str(rel / name) for name in files}
    return found


@pytest.fixture(scope="session", autouse=True)
def _leaves_the_project_as_found():
    """`make test` is the owner's inner loop: it must leave the work tree as it found it (a
    test once wrote t.yaml into the project root, and `git add .` would have committed it).
    Files a session adds are an error at its end, named."""
    before = project_files()
    yield
    added = sorted(project_files() - before)
    if added:
        pytest.fail(
            f"the tests left {len(added)} new file(s) in the project: {', '.join(added[:5])}; "
            "write under tmp_path instead",
            pytrace=False,
        )


@pytest.fixture
def tiny(tmp_path) -> list[str]:
    """Overrides for a tiny CPU run writing under tmp_path."""
    return [*TINY, f"run.output_dir={tmp_path / 'runs'}"]


def tiny_run(tiny: list[str], name: str = "default") -> Path:
    """The run folder of run `name` under `tiny`'s output folder."""
    return Path(tiny[-1].split("=", 1)[1]) / name


def stop_after(monkeypatch, step: int) -> list[str]:
    """Make fit() in this process stop after optimizer step `step` as SIGTERM does: save
    last.pt where it is (mid-epoch too) without validating, to be resumed. train.max_steps
    ends a run instead (it validates, and the lr schedule ends at it). Returns the overrides
    the stop needs: the losses read, where stop requests are seen, at every step."""
    from {{ cookiecutter.package_name }} import loop

    read = loop.read_losses

    def read_losses(run, *args):
        if run.progress.step == step:
            run.stop.reason = "SIGTERM"
        return read(run, *args)

    monkeypatch.setattr(loop, "read_losses", read_losses)
    return ["run.log_every=1"]


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    # Tests run training in-process; a torchrun environment leaking in would make it distributed,
    # and $SMOKE_OVERRIDES (docs/testing.md) would override the sizes each test chose.
    torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    for var in (*torchrun, "SMOKE_OVERRIDES"):
        monkeypatch.delenv(var, raising=False)
    torch.use_deterministic_algorithms(False)


def needs(module: str):
    """An optional library a feature's tests need (torchvision, timm): skipped where it is not
    installed, but an error where $REQUIRE_EXTRAS names it (CI's environment for the extra),
    so a broken install cannot pass as skipped."""
    if module in os.environ.get("REQUIRE_EXTRAS", "").split(","):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"the optional {module} is not installed")


def block_network(monkeypatch, tmp_path: Path, test_file: str) -> None:
    """Any attempt to reach a hub fails the test at once instead of hanging; the libraries'
    caches are empty folders of the test. HF_HUB_OFFLINE=1, as an offline cluster sets it
    (docs/data.md), makes the hub client fail without its five retries (46 s); it reads it at
    import, so it is set on the module too."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError(f"network blocked by the test ({test_file})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(
        importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", True
    )


def load_script(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package), its main() not run; in
    sys.modules, where its dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def documentation() -> str:
    """README.md and the pages of docs/, as one text with single spaces (line breaks in a
    phrase do not matter)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return " ".join(" ".join(page.read_text().split()) for page in pages)


def run_script(*args: str, timeout: float = 120, env: dict | None = None, cwd: Path = ROOT):
    """Run `python <args>` from the project root; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        # The package is importable from any cwd, installed or not (PYTHONPATH=. in a checkout).
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        },
    )


def missing_data_file(cfg, base: Path = Path()) -> str | None:
    """`data.<key>=<path>` for the first file or folder that cfg's dataset options name and
    that does not exist (a relative path from `base`, default the working directory), else
    None."""
    opts = cfg.data.options
    for field in dataclasses.fields(opts) if dataclasses.is_dataclass(opts) else ():
        value = getattr(opts, field.name)
        named = field.name in ("path", "root") or field.name.endswith(("_path", "_root"))
        if named and isinstance(value, str) and value and not (base / value).exists():
            return f"data.{field.name}={value}"
    return None


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    """A folder holding data/demo/ as scripts/make_demo_data.py writes it (once per session)."""
    root = tmp_path_factory.mktemp("demo")
    proc = run_script("scripts/make_demo_data.py", "--out", str(root / "data" / "demo"))
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def demo_data(demo_root, monkeypatch) -> Path:
    """Work in a folder holding data/demo/: the example configs' relative paths resolve."""
    monkeypatch.chdir(demo_root)
    return demo_root


def flock_failing_with(monkeypatch, error: OSError) -> None:
    """Every flock call raises `error` (a filesystem without locks, or a lock held elsewhere)."""
    from {{ cookiecutter.package_name }}.utils import locks

    def flock(fd, operation):
        raise error

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(locks, "_warned", set())  # each test sees its first warning


@pytest.fixture
def nfs_flock(monkeypatch):
    """flock as Linux's NFS client does it (it emulates flock with fcntl locks): an exclusive
    lock needs a descriptor open for writing, a shared one for reading, else EBADF."""
    real = fcntl.flock

    def flock(fd, operation):
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        if operation & fcntl.LOCK_EX and mode == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if operation & fcntl.LOCK_SH and mode == os.O_WRONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.fixture
def torch_2_6(monkeypatch):
    """torch says it is 2.6, the floor: what needs 2.7 is refused."""
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")


@pytest.fixture
def handlers():
    """The process's signal handlers as they were: a stop signal that the code under test
    fails to catch is ignored here (it would end the test run) and shows as a wrong exit."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda *_: None)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    from {{ cookiecutter.package_name }}.tools import cli

    cli._held.clear()
