"""Resume never loses or misreports work: which checkpoint is chosen, what a failed read does,
the run-folder lock, settings changed on resume, the schedule when a run is extended, finished
runs, and the records (runs.csv, metrics.csv, TensorBoard) that a resumed run keeps."""

from __future__ import annotations

import csv
import errno
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, run_script, tiny_with
from test_outputs import dead_pid

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import RunFolder
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import CheckpointError, ConfigError
from {{ cookiecutter.package_name }}.nonfinite import NonFiniteLoss
from {{ cookiecutter.package_name }}.optim import build_optimizer, build_scheduler, continue_schedule
from {{ cookiecutter.package_name }}.trainer import EXIT_PREEMPTED, fit


def run_dir(tiny, name="default") -> Path:
    return Path(load_config(None, tiny).run.output_dir) / name


def snapshot(folder: Path) -> dict:
    """Every file below `folder` (the lock file aside) and its bytes."""
    return {
        p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def clobber(path: Path) -> None:
    """Overwrite the first 4 KiB in place, as a bad disk block would (hard links see it too)."""
    with path.open("r+b") as f:
        f.write(random.Random(path.name).randbytes(4096))  # fixed bytes: a repeatable test


def step_state(step: int) -> dict:
    cfg = {"train": {"batch_size": 1, "grad_accum_steps": 1}}
    return {
        "model": {"w": torch.full((4,), float(step))},
        "optimizer": {},
        "scheduler": {},
        "scaler": {},
        "progress": {"step": step},
        "config": cfg,
    }


def test_resume_falls_back_to_best_when_every_step_file_is_corrupt(tmp_path):
    manager = RunFolder(tmp_path, keep_last=1)
    manager.save(step_state(1), 1, is_best=True)
    manager.save(step_state(2), 2, is_best=False)  # prunes step 1: best.pt keeps its data
    clobber(tmp_path / "step-00000002.pt")  # last.pt is the same file
    warnings = []
    state, path = manager.latest(warn=warnings.append, quarantine=True)
    assert path.name == "best.pt" and state["progress"]["step"] == 1
    assert len(warnings) == 1 and "step-00000002.pt" in warnings[0]  # last.pt: same inode
    assert (tmp_path / "step-00000002.pt.bad").exists()


def test_resume_never_starts_fresh_over_checkpoints_that_do_not_load(tiny):
    fit(load_config(None, [*tiny, "train.keep_last=1"]))
    for path in run_dir(tiny).glob("*.pt"):
        clobber(path)
    best = (run_dir(tiny) / "best.pt").read_bytes()
    with pytest.raises(CheckpointError, match="no checkpoint of run 'default' loads.*run.name="):
        fit(load_config(None, [*tiny, "train.epochs=3", "train.resume=auto"]))
    assert (run_dir(tiny) / "best.pt").read_bytes() == best  # nothing overwritten


@pytest.mark.slow
@pytest.mark.parametrize("failure", [OSError(errno.EIO, "Input/output error"), MemoryError()])
def test_a_failed_read_stops_the_run_and_renames_nothing(tiny, monkeypatch, failure):
    fit(load_config(None, tiny))
    before = snapshot(run_dir(tiny))

    def failing_load(*args, **kwargs):
        raise failure

    monkeypatch.setattr(torch, "load", failing_load)
    with pytest.raises(CheckpointError, match="could not be read.*nothing was renamed"):
        fit(load_config(None, [*tiny, "train.epochs=3", "train.resume=auto"]))
    assert snapshot(run_dir(tiny)) == before


@pytest.mark.slow
def test_a_second_process_on_a_run_folder_gets_one_line(tiny):
    fit(load_config(None, [*tiny, "train.max_steps=2"]))
    holder = RunFolder(run_dir(tiny), keep_last=2)
    holder.lock()  # as a run still training would
    try:
        with pytest.raises(ConfigError, match=f"held by pid {os.getpid()}.*another run.name"):
            fit(load_config(None, [*tiny, "train.resume=auto"]))
    finally:
        holder.unlock()
    assert fit(load_config(None, [*tiny, "train.resume=auto"]))["epoch"] == 2


@pytest.mark.slow
def test_a_killed_run_leaves_no_stale_lock(tiny):
    folder = run_dir(tiny)
    code = "import sys, time; from pathlib import Path; from {{ cookiecutter.package_name }}"
    code += ".checkpoint import RunFolder as M; M(Path(sys.argv[1]), 1).lock()"
    code += "; print('locked', flush=True); time.sleep(60)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match="is in use"):
        RunFolder(folder, 1).lock()
    proc.kill()
    proc.wait()
    assert fit(load_config(None, tiny))["epoch"] == 2  # kill -9 released the lock


def test_a_resume_removes_only_the_temporaries_of_processes_that_are_gone(tiny):
    """The run folder's temporaries follow the tools' rule (utils/locks.py): a report
    writing its staging folder into the run folder now keeps it through a resume; what
    killed processes left there (a tool's output, a checkpoint's bytes, a folder) is removed."""
    fit(load_config(None, [*tiny, "train.max_steps=2"]))
    folder, alive, dead = run_dir(tiny), os.getppid(), dead_pid()
    live = folder / f".best_report.tmp{alive}"
    live.mkdir()
    (live / "report.json").write_bytes(b"being written")
    stale = [folder / f".best_report.tmp{dead}", folder / f".best.model.pt.tmp{dead}"]
    stale.append(folder / f".step-00000003.dcp.tmp{dead}")  # feature: fsdp
    for path in stale:
        path.mkdir()
        (path / "part").write_bytes(b"left by a kill")
    stale.append(folder / f".step-00000003.pt.tmp{dead}")
    stale[-1].write_bytes(b"half a checkpoint")
    assert fit(load_config(None, [*tiny, "train.max_steps=3", "train.resume=auto"]))["step"] == 3
    assert (live / "report.json").read_bytes() == b"being written"
    assert not [path for path in stale if path.exists()]


def test_a_run_folder_without_checkpoints_is_not_an_existing_run(tiny):
    folder = run_dir(tiny)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("run: {}\n")  # a crash before the first save
    assert fit(load_config(None, tiny))["epoch"] == 2


@pytest.mark.slow
def test_changed_settings_apply_from_the_resumed_step_and_are_listed(tiny, capsys):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    capsys.readouterr()
    resumed = [*tiny, "train.epochs=2", "train.resume=auto", "train.lr=0.01"]
    resumed += ["train.weight_decay=0.2"]
    fit(load_config(None, resumed))
    out = capsys.readouterr().out
    assert "train.epochs 1 -> 2" in out and "train.lr 0.003 -> 0.01" in out
    assert "train.weight_decay 0.05 -> 0.2" in out
    state = checkpoint.load(run_dir(tiny) / "last.pt")
    assert state["scheduler"]["base_lrs"] == [0.01, 0.01]
    groups = state["optimizer"]["param_groups"]
    assert groups[0]["weight_decay"] == 0.2 and groups[1]["weight_decay"] == 0.0
    assert state["config"]["train"]["lr"] == 0.01  # the record is what ran


def test_the_seed_cannot_change_on_resume(tiny):
    fit(load_config(None, [*tiny, "train.max_steps=3"]))
    with pytest.raises(ConfigError, match="run.seed=7 differs from the checkpoint's 42"):
        fit(load_config(None, [*tiny, "train.resume=auto", "run.seed=7"]))


def scheduler_at(total: int, step: int, lr: float = 1.0, floor: float = 0.1):
    cfg = load_config(None, ["train.warmup_steps=10", f"train.min_lr_ratio={floor}"]).train
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg, lr, fused=False)
    scheduler = build_scheduler(optimizer, cfg, total)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    return cfg, optimizer, scheduler


def lrs_after_resume(saved_total, new_total, step):
    cfg, optimizer, scheduler = scheduler_at(saved_total, step)
    before = optimizer.param_groups[0]["lr"]
    states = optimizer.state_dict(), scheduler.state_dict()
    _, optimizer, scheduler = scheduler_at(new_total, 0)
    optimizer.load_state_dict(states[0])
    scheduler.load_state_dict(states[1])
    continue_schedule(optimizer, scheduler, cfg, 1.0, new_total)
    lrs = [optimizer.param_groups[0]["lr"]]
    for _ in range(new_total - step + 5):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return before, lrs


@pytest.mark.parametrize("step", [50, 100])
def test_extending_a_run_continues_from_the_current_lr(step):
    """A run of 100 steps stopped at `step` (mid-way, or finished at the floor) and extended to
    200: the lr continues where it was, decays without a rise, and ends at the floor."""
    before, lrs = lrs_after_resume(100, 200, step)
    assert lrs[0] == pytest.approx(before, rel=1e-12)
    assert all(b <= a + 1e-12 for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[200 - step] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.1)
    if step == 50:
        assert lrs[1] < lrs[0] and not math.isclose(lrs[1], lrs[0])


def test_best_checkpoint_follows_the_direction_of_its_metric(tiny):
    result = fit(load_config(None, [*tiny, "train.best_metric=loss", "train.epochs=3"]))
    losses = [
        float(line.split(",")[3])
        for line in (run_dir(tiny) / "metrics.csv").read_text().splitlines()[1:]
    ]
    assert result["best"] == pytest.approx(min(losses), rel=1e-5)
    with pytest.raises(ConfigError, match="train.best_mode=max would keep the worst loss"):
        load_config(None, ["train.best_metric=loss", "train.best_mode=max"])


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["train.max_steps=3", "train.epochs=2"])
def test_resuming_a_finished_run_trains_nothing_and_writes_nothing(tiny, capsys, limit):
    first = fit(load_config(None, [*tiny, limit]))
    before = snapshot(run_dir(tiny).parent)
    again = fit(load_config(None, [*tiny, limit, "train.resume=auto"]))
    assert again["step"] == first["step"]
    assert "is complete" in capsys.readouterr().out
    assert snapshot(run_dir(tiny).parent) == before


@pytest.mark.slow
def test_runs_table_keeps_one_row_per_run_under_one_header(tiny):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    fit(load_config(None, [*tiny, "train.epochs=2", "train.resume=auto"]))
    fit(load_config(None, [*tiny, "train.epochs=1", "run.name=other"]))
    lines = (run_dir(tiny).parent / "runs.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    assert [(r["run"], r["epochs"]) for r in rows] == [("default", "2"), ("other", "1")]


@pytest.mark.slow
def test_a_resumed_run_logs_each_step_once(tiny):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = [*tiny, "run.loggers=[csv,tensorboard]", "train.keep_last=3", "run.log_every=1"]
    fit(load_config(None, [*logged, "train.epochs=3"]))
    newest = sorted(run_dir(tiny).glob("step-*.pt"))[-1]
    clobber(newest)  # resume falls back to epoch 2 and trains epoch 3 again
    fit(load_config(None, [*logged, "train.epochs=3", "train.resume=auto"]))
    rows = (run_dir(tiny) / "metrics.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2", "3"]
    events = EventAccumulator(str(run_dir(tiny) / "tb")).Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    assert steps == list(range(1, 3 * 16 + 1))  # one value per step, none twice
    assert len(events.Scalars("train/epoch_loss")) == 3


def test_checkpoint_files_of_the_wrong_structure_get_one_line(tmp_path, tiny):
    fit(load_config(None, [*tiny, "train.max_steps=1"]))
    last = checkpoint.load(run_dir(tiny) / "last.pt")
    cases = {
        "bare.pt": (last["model"], "holds model weights only.*train.init_from="),
        "config.pt": ({**last, "config": "oops"}, "its 'config' is not a mapping"),
        "progress.pt": (
            {k: v for k, v in last.items() if k != "progress"},
            "not a training checkpoint of this project .no progress",
        ),
    }
    for name, (state, message) in cases.items():
        torch.save(state, tmp_path / name)
        with pytest.raises(CheckpointError, match=message):
            fit(load_config(None, [*tiny, "run.name=x", f"train.resume={tmp_path / name}"]))
    (tmp_path / "random.pt").write_bytes(os.urandom(3000))
    with pytest.raises(CheckpointError, match="is not a checkpoint .corrupt, truncated or not a"):
        checkpoint.load(tmp_path / "random.pt")
    assert not run_dir(tiny, "x").exists()


@pytest.mark.slow
def test_a_bare_state_dict_serves_evaluation_and_fine_tuning(tmp_path, tiny):
    fit(load_config(None, tiny))
    bare = tmp_path / "weights.pt"
    torch.save(checkpoint.load(run_dir(tiny) / "best.pt")["model"], bare)
    model_args = [a for a in tiny if a.startswith(("data.", "model.", "run.device"))]
    proc = run_script("scripts/evaluate.py", "--checkpoint", str(bare), "--json", *model_args)
    assert proc.returncode == 0, proc.stderr
    assert '"count": 96' in proc.stdout
    tuned = fit(
        load_config(None, [*tiny, "run.name=ft", "train.max_steps=1", f"train.init_from={bare}"])
    )
    assert tuned["step"] == 1


def test_rng_state_is_restored_from_tensors_on_another_device():
    """A checkpoint read with map_location=<cuda> hands the RNG states over as CUDA tensors,
    which cannot become numpy arrays or generator states until they are on the CPU."""
    from {{ cookiecutter.package_name }}.utils.seed import rng_state, set_rng_state

    class OnAnotherDevice(torch.Tensor):
        """Behaves like a CUDA tensor: no numpy(), refused by the CPU generator."""

        @property
        def device(self):
            return torch.device("meta")

        def numpy(self, *args, **kwargs):
            raise TypeError("can't convert cuda:0 device type tensor to numpy")

        def cpu(self, *args, **kwargs):
            return torch.Tensor(self.as_subclass(torch.Tensor)).clone()

    torch.manual_seed(3)
    state = rng_state()
    expected = torch.rand(5)
    moved = {
        **state,
        "torch": state["torch"].as_subclass(OnAnotherDevice),
        "numpy": {**state["numpy"], "key": state["numpy"]["key"].as_subclass(OnAnotherDevice)},
    }
    torch.manual_seed(0)
    set_rng_state(moved)
    assert torch.equal(torch.rand(5), expected)


@pytest.mark.slow
def test_checkpoints_are_read_on_the_cpu(tiny, monkeypatch):
    fit(load_config(None, [*tiny, "train.max_steps=2"]))
    seen = []
    original = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("map_location"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    fit(load_config(None, [*tiny, "train.resume=auto", "train.max_steps=3"]))
    assert seen and set(seen) == {"cpu"}


# scripts/train.py whose run is signalled three times: SIGTERM mid-epoch, SIGTERM again
# during the final save, SIGUSR1 during teardown. Only the first may count.
_SIGNALLED = """
import os, signal, sys
from {{ cookiecutter.package_name }} import distributed, loop
from {{ cookiecutter.package_name }}.checkpoint import run_folder
from {{ cookiecutter.package_name }}.tools.train import train_main

read, save, teardown = loop.read_losses, run_folder.RunFolder.save, distributed.teardown

def read_losses(loop, *args):
    if loop.progress.step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
    return read(loop, *args)

def saving(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return save(self, *args, **kwargs)

def tearing_down():
    teardown()
    os.kill(os.getpid(), signal.SIGUSR1)

loop.read_losses, run_folder.RunFolder.save = read_losses, saving
distributed.teardown = tearing_down
raise SystemExit(train_main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_signals_during_the_final_save_and_teardown_still_exit_75(tmp_path, tiny):
    script = tmp_path / "signalled.py"
    script.write_text(textwrap.dedent(_SIGNALLED))
    env = {"PYTHONPATH": str(ROOT)}
    proc = run_script(str(script), *tiny, "run.log_every=1", env=env)
    assert proc.returncode == EXIT_PREEMPTED, proc.stdout + proc.stderr
    assert "stopped (SIGTERM) at step 3" in proc.stdout
    assert checkpoint.load(run_dir(tiny) / "last.pt")["progress"]["step"] == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage", [b"epoch,step,time/elapsed_s\n1,abc,1.5\n", b"epoch,step\n1,\xff\xfe16\n"]
)
def test_a_damaged_metrics_csv_is_set_aside_and_the_resume_goes_on(tiny, capsys, damage):
    """A cell that is not a number, bytes that are not UTF-8: the checkpoints hold the run."""
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    metrics = run_dir(tiny) / "metrics.csv"
    metrics.write_bytes(damage)
    assert fit(load_config(None, [*tiny, "train.resume=auto"]))["epoch"] == 2
    assert (run_dir(tiny) / "metrics.csv.damaged").read_bytes() == damage
    assert "metrics.csv is damaged" in capsys.readouterr().out
    assert [row["epoch"] for row in csv.DictReader(metrics.open())] == ["2"]


def test_a_damaged_runs_csv_is_set_aside_and_the_run_finishes(tiny, capsys):
    table = Path(load_config(None, tiny).run.output_dir) / "runs.csv"
    table.parent.mkdir(parents=True)
    table.write_bytes(b"run,steps\n\xff\xfe,1\n")
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    assert (table.parent / "runs.csv.damaged").read_bytes() == b"run,steps\n\xff\xfe,1\n"
    assert "runs.csv is damaged" in capsys.readouterr().out
    assert [row["run"] for row in csv.DictReader(table.open())] == ["default"]


@pytest.mark.slow
def test_a_failed_resume_leaves_config_yaml_as_it_was(tmp_path, tiny):
    """The resume fails at its first step (NaN inputs under a new data.root): config.yaml
    still holds the settings the checkpoints were trained with. A damaged config.yaml does
    not stop a resume: it is rewritten with the resume's first checkpoint."""
    x, y = torch.randn(64, 3, 8, 8), torch.arange(64) % 4
    for name, inputs in (("good", x), ("bad", torch.full_like(x, float("nan")))):
        (tmp_path / name).mkdir()
        for split in ("train", "val"):
            torch.save({"x": inputs, "y": y}, tmp_path / name / f"{split}.pt")
    args = [*tiny_with(tiny, "data.name=tensors", "train.batch_size=8"), "model.name=mlp"]
    fit(load_config(None, [*args, "train.max_steps=2", f"data.root={tmp_path / 'good'}"]))
    config = run_dir(tiny) / "config.yaml"
    before = config.read_bytes()
    with pytest.raises(NonFiniteLoss, match="loss is not finite at step 3"):
        fit(load_config(None, [*args, "train.resume=auto", f"data.root={tmp_path / 'bad'}"]))
    assert config.read_bytes() == before
    config.write_bytes(b"\xff\xfe: [")
    good = [*args, "train.resume=auto", "train.max_steps=4", f"data.root={tmp_path / 'good'}"]
    assert fit(load_config(None, good))["step"] == 4
    assert yaml.safe_load(config.read_text())["train"]["max_steps"] == 4
