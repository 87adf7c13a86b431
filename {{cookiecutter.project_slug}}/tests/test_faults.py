"""Faults must not lose work: preemption signals, kill -9 during saves, corrupt checkpoints,
checkpoints that do not fit, and fine-tuning from another run's weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.trainer import EXIT_PREEMPTED, fit
from {{ cookiecutter.package_name }}.utils.signals import StopSignal

# Fault injection and signals: make test-all (test_end_to_end.py keeps a fast stop-resume).
pytestmark = pytest.mark.slow


def out_dir(tiny, name="default") -> Path:
    return Path(load_config(None, tiny).run.output_dir) / name


def launch(*overrides: str) -> subprocess.Popen:
    """scripts/train.py in its own process group, stdout and stderr together in .stdout."""
    return subprocess.Popen(
        [sys.executable, "scripts/train.py", *overrides],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The last checkpoint of an uninterrupted run of `args` (their run.output_dir aside),
    trained once for every signal whose resumed run is compared with it."""
    done = {}

    def last(args: list[str]) -> dict:
        key = tuple(a for a in args if not a.startswith("run.output_dir="))
        if key not in done:
            out = tmp_path_factory.mktemp("uninterrupted")
            fit(load_config(None, [*key, f"run.output_dir={out}", "run.name=straight"]))
            done[key] = checkpoint.load(out / "straight" / "last.pt")
        return done[key]

    return last


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGTERM, 0), (signal.SIGTERM, 2), (signal.SIGINT, 2)],  # SIGINT: Ctrl-C
)
def test_a_stop_signal_mid_epoch_saves_and_the_resumed_run_matches_an_uninterrupted_one(
    tiny, sig, workers, uninterrupted
):
    """With loader workers the signal goes to the whole process group, as torchrun, SLURM and
    a terminal's Ctrl-C send it: the workers must outlive it so that the training process can
    save."""
    exact = [
        *tiny,
        "run.deterministic=true",
        "data.train_size=1024",  # 64 steps an epoch: the signal has 128 steps to land in
        "train.epochs=3",
        "model.width=16",
    ]
    # One reference for every case: loader workers must not change the batches either.
    expected = uninterrupted(exact)
    exact.append(f"data.num_workers={workers}")

    proc = launch(*exact, "run.name=preempted")
    # Signal as soon as epoch 1 is saved: the run is then inside epoch 2 of 3.
    deadline = time.monotonic() + 60
    while not list(out_dir(tiny, "preempted").glob("step-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, sig)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == EXIT_PREEMPTED, rest
    assert f"stopped ({sig.name})" in rest and "DataLoader worker" not in rest
    saved = checkpoint.load(out_dir(tiny, "preempted") / "last.pt")
    total = expected["progress"]["step"]
    assert 0 < saved["progress"]["step"] < total, "the signal should land mid-run"

    # In this process: what is asked of the resume is its weights, not its process.
    assert train_main([*exact, "run.name=preempted", "train.resume=auto"]) == 0
    final = checkpoint.load(out_dir(tiny, "preempted") / "last.pt")
    assert final["progress"]["step"] == total
    assert same_weights(final["model"], expected["model"])


def test_sigterm_again_and_again_after_the_first_still_ends_with_75(tiny):
    """A scheduler may repeat its SIGTERM; one that lands while the process exits after its
    save (Python's shutdown puts the default handler back) killed it with -15."""
    proc = launch(*tiny, "train.epochs=20")  # 16 steps an epoch: the first saves soon
    deadline = time.monotonic() + 60
    while not list(out_dir(tiny).glob("step-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    while proc.poll() is None:  # the first, then one every 0.1 s until the process has ended
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
    rest = proc.stdout.read()
    assert proc.returncode == EXIT_PREEMPTED and "stopped (SIGTERM)" in rest, rest
    assert "Traceback" not in rest
    assert checkpoint.load(out_dir(tiny) / "last.pt")["progress"]["step"] > 0


def test_a_sigterm_during_start_up_stops_cleanly(tiny):
    """Sent while torch is being imported (its library mapped into the process: Linux's
    /proc), before the run has installed its handlers; it used to end the process with -15."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs Linux's /proc to see when torch is being imported")
    proc = launch(*tiny)
    deadline = time.monotonic() + 60
    while "libtorch" not in _mapped(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == EXIT_PREEMPTED and "stopped (SIGTERM)" in rest, rest
    assert "Traceback" not in rest
    saved = checkpoint.load(out_dir(tiny) / "last.pt")  # complete: a resume continues it
    assert saved["progress"]["step"] == 1
    # What made the run was recorded before its first step, whole, and the checkpoint keeps it.
    record = json.loads((out_dir(tiny) / "run.json").read_text())
    assert {"command", "code", "software", "machine", "launch", "data"} <= record.keys()
    assert saved["meta"]["record"] == record


def _mapped(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # the process has ended
        return "libtorch (gone)"


def test_a_second_ctrl_c_quits_without_waiting_for_the_save():
    stop = StopSignal()
    stop.install()
    try:
        signal.raise_signal(signal.SIGINT)
        assert stop.reason == "SIGINT"  # the first one asks for a save and a stop
        signal.raise_signal(signal.SIGTERM)  # a scheduler's signal besides is only noted
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# Imports torch once, then for each delay read from stdin forks a saver that saves without
# end (killed with -9, a fork leaves its files as a fresh process would), kills it
# that long after its first completed save and says "killed". A process per kill would pay
# the import each time.
_KILLER = """
import os, signal, sys, time, torch
from pathlib import Path
from {{ cookiecutter.package_name }}.checkpoint import RunFolder
state = {"model": {"w": torch.randn(1_000_000)}, "progress": {"step": 0}, "config": {}}
state.update(optimizer={}, scheduler={}, scaler={})
parent = os.getpid()
for delay in sys.stdin:
    saved, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(saved)
        manager, step = RunFolder(Path(sys.argv[1]), keep_last=2), 0
        while os.getppid() == parent:  # a fork left behind by a failed test ends too
            step += 1
            state["progress"]["step"] = step
            manager.save(state, step, is_best=step % 3 == 0)
            os.write(told, b"saved\\n")
        os._exit(1)
    os.close(told)
    with os.fdopen(saved) as f:
        f.readline()  # at least one save completed; now kill at the moment asked
        time.sleep(float(delay))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print("killed", flush=True)
"""


@pytest.mark.slow
def test_kill_9_during_saves_never_leaves_an_unloadable_checkpoint(tmp_path):
    folder = tmp_path / "run"
    rng = random.Random(0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    killer = subprocess.Popen(
        [sys.executable, "-c", _KILLER, str(folder)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(12):
            killer.stdin.write(f"{rng.uniform(0.0, 0.3)}\n")
            killer.stdin.flush()
            assert killer.stdout.readline() == "killed\n"
            for path in [*folder.glob("step-*.pt"), folder / "last.pt", folder / "best.pt"]:
                if path.exists():
                    state = checkpoint.load(path)  # raises if truncated
                    assert state["model"]["w"].numel() == 1_000_000
            found = RunFolder(folder, 2).latest()
            assert found is not None
        killer.stdin.close()
        assert killer.wait(timeout=60) == 0
    finally:
        if killer.poll() is None:
            killer.kill()


def test_corrupt_newest_checkpoint_is_reported_and_the_previous_one_used(tiny, capsys):
    fit(load_config(None, [*tiny, "train.epochs=3", "train.keep_last=3"]))
    steps = sorted(out_dir(tiny).glob("step-*.pt"))
    newest = steps[-1]
    previous_step = checkpoint.load(steps[-2])["progress"]["step"]
    newest.write_bytes(newest.read_bytes()[:5000])  # truncated, as by a full disk
    result = fit(load_config(None, [*tiny, "train.epochs=4", "train.resume=auto"]))
    out = capsys.readouterr().out
    assert f"skipping checkpoint '{newest}' is not a checkpoint (corrupt, truncated" in out
    assert f"resumed at step {previous_step}" in out
    assert result["epoch"] == 4
    assert (newest.parent / (newest.name + ".bad")).exists()


def test_resume_into_a_different_model_names_the_mismatch_and_writes_nothing(tiny, capsys):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    last = out_dir(tiny) / "last.pt"
    before = last.read_bytes()
    capsys.readouterr()
    code = train_main([*tiny, "model.width=16", "run.name=other", f"train.resume={last}"])
    assert code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "does not fit this model" in line
    assert "shape: features.0.layers.0.weight (8, 3, 3, 3) vs (16, 3, 3, 3)" in line
    assert last.read_bytes() == before and not out_dir(tiny, "other").exists()


def test_pickled_code_in_a_checkpoint_is_refused_with_one_line(tmp_path, tiny, capsys):
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "hook": os.system}, evil)  # would run code if unpickled freely
    capsys.readouterr()
    assert train_main([*tiny, f"train.resume={evil}"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: checkpoint") and "pickled Python objects" in stderr


def test_init_from_loads_what_fits_and_keeps_a_new_head(tiny, capsys):
    fit(load_config(None, tiny))
    source = checkpoint.load(out_dir(tiny) / "best.pt")["model"]
    fit(
        load_config(
            None,
            [
                *tiny,
                "run.name=finetune",
                "data.num_classes=3",
                "train.max_steps=1",
                f"train.init_from={out_dir(tiny) / 'best.pt'}",
            ],
        )
    )
    assert "new (not loaded): ['head.1.bias', 'head.1.weight']" in capsys.readouterr().out
    first = checkpoint.load(out_dir(tiny, "finetune") / "last.pt")
    assert first["model"]["head.1.weight"].shape[0] == 3
    # One step of training later the backbone has moved, but it started from the source.
    assert first["progress"]["step"] == 1
    assert not torch.equal(first["model"]["head.1.weight"][:3], source["head.1.weight"][:3])


def test_a_stop_signal_while_loader_workers_start_leaves_them_running(tiny, monkeypatch):
    """A SIGTERM to the whole job can reach a loader worker between its fork and the moment it
    starts ignoring the signal (torch's own worker handler dies of it, and the training process
    then raises "DataLoader worker exited unexpectedly" instead of saving). Here each worker
    is signalled in that moment: the loader must still deliver every batch."""
    from {{ cookiecutter.package_name }} import data as data_module

    def signalled_while_starting(worker_id: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(data_module, "seed_worker", signalled_while_starting)
    cfg = load_config(None, [*tiny, "data.num_workers=2"])
    train_set, _, _ = data_module.build_datasets(cfg.data, "class")
    loader = data_module.build_loader(train_set, cfg.data, 16, train=True, seed=0)
    try:
        assert sum(len(y) for _, y in loader) == len(train_set) // 16 * 16
    finally:
        data_module.close_loader(loader)


def test_init_from_starts_a_fresh_run_under_resume_and_a_resume_continues_its_own_run(
    tiny, capsys, monkeypatch
):
    """SLURM jobs always pass train.resume=auto: init_from applies where nothing is
    there to resume, and a checkpoint found (or named by train.resume=PATH) wins over it."""
    fit(load_config(None, tiny))
    source = out_dir(tiny) / "best.pt"
    # A learning rate this small leaves the weights where they started.
    tuned = [*tiny, "run.name=ft", f"train.init_from={source}", "train.lr=1e-12"]
    fit(load_config(None, [*tuned, "train.resume=auto", "train.max_steps=1"]))
    assert f"init_from {source}: new (not loaded): none" in capsys.readouterr().out
    last = out_dir(tiny, "ft") / "last.pt"
    first = checkpoint.load(last)["model"]
    for key, value in checkpoint.load(source)["model"].items():
        if value.is_floating_point() and "running" not in key:  # BatchNorm statistics move
            torch.testing.assert_close(first[key], value, rtol=0, atol=1e-6, msg=key)

    def refuse(*args):
        raise AssertionError("init_from loaded over a run that resumes")

    monkeypatch.setattr(checkpoint, "init_from", refuse)
    for steps, resume in ((2, "auto"), (3, last)):
        limits = [f"train.resume={resume}", f"train.max_steps={steps}"]
        assert fit(load_config(None, [*tuned, *limits]))["step"] == steps
        out = capsys.readouterr().out
        assert f"train.init_from is not used: the run resumes from {last.parent}" in out
