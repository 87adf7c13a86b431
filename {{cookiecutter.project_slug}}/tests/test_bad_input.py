"""Every bad input gets one line: exit 2, one stderr line `error: <problem>; <fix>`, no
traceback, and every file that existed before the run is byte-identical after it.

Most cases run `train_main(argv)` in-process (a subprocess costs ~2 s); a few run the
real scripts, including a real file-size limit. Faults a root user cannot cause without
mounts (a full disk, a read-only file system, a refused permission) are injected in-process.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_script, tiny_with

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.tools.train import train_main

EXPECTED_FORMAT = (
    '{"x": float tensor (N, ...), "y": int64 class ids (N,) or float targets (N,) / (N, K)}'
)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file and its bytes; not a run folder's .lock, which names the process holding it."""
    files = (p for p in root.rglob("*") if p.is_file() and p.name != ".lock")
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def assert_one_line(code: int, stderr: str, message: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert message in lines[0], lines[0]


def assert_unchanged(before: dict[str, bytes], root: Path, new_files: bool = False) -> None:
    after = snapshot(root)
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"changed or removed: {changed}"
    assert not [k for k in after if ".tmp" in k], "a temporary file was left behind"
    if not new_files:
        assert after.keys() == before.keys(), f"written: {sorted(after.keys() - before.keys())}"


def train(argv: list[str], capsys) -> tuple[int, str]:
    """train_main in-process: (exit code, stderr)."""
    capsys.readouterr()
    code = train_main(argv)
    return code, capsys.readouterr().err


# --- Inputs the checks refuse before anything is written ------------------------------------


def write(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def config_file(content: bytes | str):
    return lambda tmp: ["--config", str(write(tmp / "exp.yaml", content))]


def tensor_files(train: dict, val: dict | None = None):
    def prepare(tmp: Path) -> list[str]:
        for split, blob in (("train", train), ("val", val or train)):
            (tmp / "data").mkdir(exist_ok=True)
            if isinstance(blob, bytes):
                write(tmp / "data" / f"{split}.pt", blob)
            else:
                torch.save(blob, tmp / "data" / f"{split}.pt")
        return ["data.name=tensors", f"data.root={tmp / 'data'}"]

    return prepare


def args(*items: str):
    return lambda tmp: list(items)


X, Y = torch.randn(64, 3, 8, 8), torch.arange(64) % 4
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
FORMAT = "expected " + EXPECTED_FORMAT

BEFORE_WRITING = {
    # Config files and overrides
    "missing config": (args("--config", "configs/nope.yaml"), "'configs/nope.yaml' not found"),
    "malformed value": (args("train.lr=[1"), "override 'train.lr=[1': cannot read the value"),
    "python tag": (args("run.name=!!python/name:os.system"), "cannot read the value"),
    "value nested deep": (args("train.lr=" + "[" * 2_000), "cannot read the value (nested"),
    "binary config": (config_file(b"\x00\x01PK\x03\x04"), "is binary, not YAML text"),
    "latin-1 config": (
        config_file("train:\n  lr: 0.1 # d\xe9j\xe0\n".encode("latin-1")),
        "is not UTF-8 text (byte 0xe9",
    ),
    "invalid yaml": (config_file("train: [1, 2\n"), "line 2 is not valid YAML"),
    "config is a list": (config_file("- 1\n"), "must hold a mapping of sections"),
    "extends a list": (config_file("extends: [a.yaml]\n"), "extends must be the path"),
    "extends missing": (config_file("extends: nope.yaml\n"), "not found (check extends: in"),
    "nested deep": (config_file("[" * 2_000), "is nested too deeply to read"),
    "unknown key": (args("train.epoch=2"), "did you mean 'train.epochs'?"),
    "batch 0": (args("train.batch_size=0"), "train.batch_size must be >= 1"),
    "negative seed": (args("run.seed=-1"), "run.seed must be between 0 and 2**63 - 1"),
    "seed > 64 bits": (args(f"run.seed={2**64}"), "run.seed must fit in 64 bits"),
    "lr 1e400": (args("train.lr=1e400"), "train.lr must be a finite number > 0, got inf"),
    "lr 10**400": (args("train.lr=1" + "0" * 400), "train.lr must be a finite number > 0"),
    "lr nan": (args("train.lr=.nan"), "train.lr must be a finite number > 0, got nan"),
    "epochs 1e9": (args("train.epochs=1e9"), "train.epochs expects int, got '1e9'"),
    "depth 10**6": (args("model.depth=1000000"), "model.depth must be between 1 and 64"),
    "workers 10**5": (args("data.num_workers=100000"), "data.num_workers must be between 0"),
    "workers beyond the cpus": (
        args(f"data.num_workers={4 * CPUS + 1}"),
        f"is more than 4 loader processes per CPU this process may use ({CPUS} CPUs)",
    ),
    "threads beyond the cpus": (
        args(f"run.threads={CPUS + 1}"),
        f"is more than the {CPUS} CPUs this process may use (its affinity mask)",
    ),
    "epochs 0": (args("train.epochs=0"), "train.epochs must be >= 1, got 0"),
    "weight decay inf": (
        args("train.weight_decay=inf"),
        "train.weight_decay must be a finite number, got inf",
    ),
    "section twice in a file": (
        config_file("train:\n  lr: 0.01\ntrain:\n  epochs: 1\n"),
        "line 3 gives the key 'train' twice in one mapping",
    ),
    "log_every -1": (args("run.log_every=-1"), "run.log_every must be >= 1"),
    "batch 10**12": (args("train.batch_size=1000000000000"), "exceeds the 256 training samples"),
    "fp16 on cpu": (args("train.amp=fp16"), "train.amp=fp16 needs a GPU"),
    "unknown model": (
        args("model.name=resnet"),
        "model.name='resnet' is not one of the registered choices cnn, mlp"[:50],
    ),
    "unknown dataset": (
        args("data.name=imagenet"),
        "data.name='imagenet' is not one of the registered choices synthetic",
    ),
    "missing resume": (args("train.resume=/no/such/ckpt.pt"), "'/no/such/ckpt.pt' not found"),
    # A model that cannot run on the data, or does not fit in memory
    "cnn too deep": (
        args("model.depth=6"),
        "model.name=cnn (model.width=8, model.depth=6, model.dropout=0.1) cannot run on inputs "
        "of shape (3, 8, 8)",
    ),
    "width 10**6": (args("model.width=1000000"), "does not fit in memory"),
    "width 10**18": (args(f"model.width={10**18}"), "lower model.width or model.depth"),
    "images 10**5": (args("data.image_size=100000"), "out of memory"),
    # Tensor files
    "missing data": (
        args("data.name=tensors", "data.root=/no/such/dir"),
        "data file '/no/such/dir/train.pt' not found",
    ),
    "cnn on features": (
        tensor_files({"x": torch.randn(64, 20), "y": Y}),
        "cannot run on inputs of shape (20,)",
    ),
    "uint8 images": (
        tensor_files({"x": (X * 50).to(torch.uint8), "y": Y}),
        "x is torch.uint8; convert it once, e.g. x.float() / 255",
    ),
    "1-d inputs": (tensor_files({"x": torch.randn(64), "y": Y}), "x has shape (64,)"),
    "val shape": (
        tensor_files({"x": X, "y": Y}, {"x": torch.randn(64, 3, 9, 9), "y": Y}),
        "val.pt': samples are (3, 9, 9), but (3, 8, 8) in train.pt",
    ),
    "negative label": (tensor_files({"x": X, "y": Y - 1}), "y holds -1; class ids start at 0"),
    "val label": (
        tensor_files({"x": X, "y": Y}, {"x": X, "y": Y + 1}),
        "y holds class 4, but train.pt has classes 0..3 only",
    ),
    "float labels": (tensor_files({"x": X, "y": Y.float()}), "use task.name=regression, or"),
    "val labels of another kind": (
        tensor_files({"x": X, "y": Y}, {"x": X, "y": Y.float()}),
        "val.pt': y is torch.float32 of sample shape (), but torch.int64",
    ),
    # >>> text
    "val tokens beyond train's": (
        tensor_files(
            {"x": torch.randint(8, (64, 6)), "y": torch.randint(8, (64, 6))},
            {"x": torch.randint(9, (64, 6)).clamp(min=8), "y": torch.randint(8, (64, 6))},
        ),
        "val.pt': it holds token 8, but train.pt has tokens 0..7 only",
    ),
    # <<< text
    # >>> !text
    "token ids without the text option": (
        tensor_files({"x": torch.randint(8, (64, 6)), "y": torch.randint(8, (64, 6))}),
        "token ids in and out (int64 x, y of one shape) needs the template option text",
    ),
    # <<< !text
    "one-hot labels": (
        tensor_files({"x": X, "y": torch.nn.functional.one_hot(Y)}),
        "y.argmax(1) for one-hot rows",
    ),
    "lengths": (tensor_files({"x": X, "y": Y[:10]}), "x has 64 samples but y has 10 labels"),
    "keys": (tensor_files({"inputs": X, "y": Y}), "holds ['inputs', 'y'], not the keys"),
    "x a list": (tensor_files({"x": X.tolist(), "y": Y}), "x is a list, not a tensor"),
    "one class": (tensor_files({"x": X, "y": Y * 0}), "a classifier needs at least 2 classes"),
    "no samples": (tensor_files({"x": X[:0], "y": Y[:0]}), "it holds no samples"),
    "pickled code": (
        tensor_files({"x": X, "y": Y, "hook": os.system}),
        "holds pickled Python objects",
    ),
    "text file": (tensor_files(b"x,y\n1,2\n"), "not a file written by torch.save"),
}


# Reading 2,000 levels of nesting takes seconds: make test-all.
DEEP = {"value nested deep", "nested deep"}


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        pytest.param(*case, id=name, marks=[pytest.mark.slow] if name in DEEP else [])
        for name, case in BEFORE_WRITING.items()
    ],
)
def test_bad_input_gives_one_line_and_writes_nothing(tmp_path, tiny, capsys, prepare, message):
    argv = tiny_with(tiny, *prepare(tmp_path))
    before = snapshot(tmp_path)
    assert_one_line(*train(argv, capsys), message)
    assert_unchanged(before, tmp_path)
    assert not (tmp_path / "runs").exists()


def test_tensor_file_message_states_the_expected_format(tmp_path, tiny, capsys):
    argv = tiny_with(tiny, *tensor_files({"x": X, "y": Y[:10]})(tmp_path))
    assert_one_line(*train(argv, capsys), FORMAT)


@pytest.mark.slow
def test_bad_input_in_a_real_process_gives_one_line(tmp_path, tiny):
    """The script itself: exit status and stderr as a user sees them (torch's own message
    for pickled code is seven lines)."""
    data = tensor_files({"x": X, "y": Y, "hook": os.system})(tmp_path)
    proc = run_script("scripts/train.py", *tiny_with(tiny, *data))
    assert_one_line(proc.returncode, proc.stderr, "holds pickled Python objects")
    assert not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(tiny):
    with pytest.raises(Exception, match="train.batch_size must be >= 1"):
        train_main([*tiny, "train.batch_size=0", "--debug"])


@pytest.mark.slow
def test_grayscale_float64_images_train_with_the_cnn(tmp_path, tiny, capsys):
    """sklearn's digits as saved from numpy: float64 (N, 8, 8) get float32 and a channel."""
    data = tensor_files({"x": torch.rand(64, 8, 8, dtype=torch.float64) * 16, "y": Y})(tmp_path)
    assert train(tiny_with(tiny, *data, "train.max_steps=1"), capsys) == (0, "")
    state = checkpoint.load(tmp_path / "runs" / "default" / "last.pt")
    assert state["model"]["features.0.layers.0.weight"].shape[1] == 1  # one input channel


# --- The file system refuses: one line, earlier files intact, the run resumes -----------------


def in_runs(tmp: Path, *parts: str) -> Path:
    return tmp.joinpath("runs", *parts)


def prepare_file_as_run_dir(tmp, tiny, capsys):
    write(in_runs(tmp, "default"), "not a folder")
    return []


def prepare_file_as_output_dir(tmp, tiny, capsys):
    write(in_runs(tmp), "not a folder")
    return []


def prepare_metrics_dir(tmp, tiny, capsys):
    assert train([*tiny, "train.epochs=1"], capsys)[0] == 0
    in_runs(tmp, "default", "metrics.csv").unlink()
    write(in_runs(tmp, "default", "metrics.csv", "keep"), "")
    return ["train.epochs=2", "train.resume=auto"]  # one more epoch, which would log a row


def prepare_runs_csv_dir(tmp, tiny, capsys):
    write(in_runs(tmp, "runs.csv", "keep"), "")
    return []


FILESYSTEM = {
    "run dir is a file": (prepare_file_as_run_dir, "File exists; remove or rename that file"),
    "output dir is a file": (prepare_file_as_output_dir, "Not a directory; a part of that path"),
    "metrics.csv is a folder": (prepare_metrics_dir, "metrics.csv': Is a directory"),
    "runs.csv is a folder": (prepare_runs_csv_dir, "runs.csv': Is a directory"),
    "run.name too long": (lambda *_: ["run.name=" + "r" * 300], "File name too long"),
}


@pytest.mark.slow
@pytest.mark.parametrize(("prepare", "message"), FILESYSTEM.values(), ids=list(FILESYSTEM))
def test_file_system_refusals_give_one_line(tmp_path, tiny, capsys, prepare, message):
    argv = [*tiny, *prepare(tmp_path, tiny, capsys)]
    before = snapshot(tmp_path)
    assert_one_line(*train(argv, capsys), message)
    assert_unchanged(before, tmp_path, new_files=True)


def failing_save(fail_on: int):
    """A torch.save that fails on call number `fail_on` as torch does on a full disk: some
    bytes written, then a RuntimeError whose context is the OSError."""
    real, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) != fail_on:
            return real(obj, f, *args, **kwargs)
        try:
            f.write(b"PK\x03\x04partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] unexpected pos"
            ) from None

    return save


@pytest.mark.slow
def test_full_disk_keeps_the_saved_checkpoints_and_the_run_resumes(
    tmp_path, tiny, capsys, monkeypatch
):
    argv = [*tiny, "train.epochs=2", "train.resume=auto"]
    # Epoch 1 saves, the disk fills at epoch 2's save.
    monkeypatch.setattr(torch, "save", failing_save(fail_on=2))
    assert_one_line(*train(argv, capsys), "No space left on device; free space")
    # Again, full from the start: nothing that exists changes.
    before = snapshot(tmp_path)
    monkeypatch.setattr(torch, "save", failing_save(fail_on=1))
    code, err = train(argv, capsys)
    assert_one_line(code, err, f"cannot write under '{in_runs(tmp_path, 'default')}'")
    assert_unchanged(before, tmp_path)
    assert checkpoint.load(in_runs(tmp_path, "default", "last.pt"))["progress"]["epoch"] == 1
    # Space again: the same command continues.
    monkeypatch.undo()
    assert train(argv, capsys) == (0, "")
    assert checkpoint.load(in_runs(tmp_path, "default", "last.pt"))["progress"]["epoch"] == 2


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_file_size_limit_gives_one_line_and_the_run_resumes(tmp_path, tiny, capsys, monkeypatch):
    import resource

    argv = [*tiny, "train.epochs=2", "train.resume=auto"]
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", failing_save(fail_on=2))
        assert train(argv, capsys)[0] == 2  # epoch 1 saved (~90 KB checkpoints)
    before = snapshot(tmp_path)

    def limit():  # config.yaml (<1 KB) fits, a checkpoint does not; SIGXFSZ stays default
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    proc = _run_limited(argv, limit)
    assert_one_line(proc.returncode, proc.stderr, "File too large; raise the file-size limit")
    assert_unchanged(before, tmp_path)
    assert train(argv, capsys) == (0, "")
    assert checkpoint.load(in_runs(tmp_path, "default", "last.pt"))["progress"]["epoch"] == 2


def _run_limited(argv, preexec_fn):
    import subprocess

    return subprocess.run(
        [sys.executable, "scripts/train.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec_fn,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},  # no .pyc write hits the limit
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (errno.EROFS, "Read-only file system; choose a writable run.output_dir"),
        (errno.EACCES, "Permission denied; choose a run.output_dir you may write to"),
        (errno.ENOSPC, "No space left on device"),
    ],
    ids=["read-only", "permission", "full at mkdir"],
)
def test_injected_refusals_at_the_first_write(tmp_path, tiny, capsys, monkeypatch, error, message):
    def refuse(path, *args, **kwargs):
        raise OSError(error, os.strerror(error), str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    before = snapshot(tmp_path)
    assert_one_line(*train(tiny, capsys), message)
    assert_unchanged(before, tmp_path)


def test_other_os_errors_keep_their_traceback(tiny, monkeypatch):
    """A socket error is not the user's path to fix: it must not be hidden behind one line."""

    def refuse(*args, **kwargs):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(ConnectionResetError):
        train_main(tiny)


# --- Evaluation ------------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluate_on_data_that_does_not_fit_gives_one_line(tmp_path, tiny, capsys):
    data = tensor_files({"x": X, "y": Y})(tmp_path)
    assert train(tiny_with(tiny, *data, "train.max_steps=1"), capsys)[0] == 0
    torch.save({"x": X, "y": Y + 3}, tmp_path / "data" / "val.pt")  # classes 3..6 of 0..3
    before = snapshot(tmp_path)
    last = in_runs(tmp_path, "default", "last.pt")
    proc = run_script("scripts/evaluate.py", "--checkpoint", str(last), "run.device=cpu")
    assert_one_line(proc.returncode, proc.stderr, "y holds class 6, but train.pt has classes")
    assert_unchanged(before, tmp_path)


def test_non_finite_outputs_in_evaluation_or_validation_give_one_line_and_write_nothing(
    tmp_path, tiny, capsys
):
    """A nan probability used to stop in torch's bincount, deep in the metric code."""
    from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main

    assert train(tiny_with(tiny, "train.max_steps=1"), capsys)[0] == 0
    last = in_runs(tmp_path, "default", "last.pt")
    state = checkpoint.load(last)
    state["model"] = {k: v.float() * torch.nan for k, v in state["model"].items()}
    broken = tmp_path / "nan.pt"
    torch.save(state, broken)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = evaluate_main(["--checkpoint", str(broken), "--report", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert_one_line(code, err, f"outputs on the validation split of {broken} are not finite")
    assert_unchanged(before, tmp_path)
    # Fine-tuning from it: refused before anything is written, naming a tensor.
    code, err = train(tiny_with(tiny, f"train.init_from={broken}", "run.name=b"), capsys)
    assert_one_line(code, err, f"train.init_from={str(broken)!r}: tensor ")
    assert "holds nan or inf values" in err and not (tmp_path / "runs" / "b").exists()
