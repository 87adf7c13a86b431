"""Training, checkpointing, resuming and evaluating, in-process on CPU in seconds."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_script, stop_after, tiny_with

from {{ cookiecutter.package_name }} import checkpoint, trainer
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data.in_memory import InMemoryDataset
from {{ cookiecutter.package_name }}.errors import CheckpointError, ConfigError
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint, evaluate_main
from {{ cookiecutter.package_name }}.tools.train import smoke_main, train_main
from {{ cookiecutter.package_name }}.trainer import fit


def run_dir(tiny, name="default"):
    return load_config(None, tiny).run.output_dir + "/" + name


def test_two_step_run_trains_and_writes_its_run_folder(tiny):
    result = fit(load_config(None, [*tiny, "train.max_steps=2"]))
    assert result["step"] == 2 and result["stopped"] == "max_steps"
    out = run_dir(tiny)
    state = checkpoint.load(f"{out}/last.pt")
    assert state["progress"]["step"] == 2
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])
    assert load_config(f"{out}/config.yaml") == load_config(None, [*tiny, "train.max_steps=2"])


def test_full_run_learns_and_keeps_best_and_last(tiny):
    result = fit(load_config(None, [*tiny, "train.epochs=3"]))
    assert result["epoch"] == 3 and result["metrics"]["acc"] > 0.5  # chance is 0.25
    out = run_dir(tiny)
    best, last = checkpoint.load(f"{out}/best.pt"), checkpoint.load(f"{out}/last.pt")
    assert best["progress"]["best"] == result["best"]
    assert last["progress"]["step"] == result["step"]
    for key in ("model", "optimizer", "scheduler", "scaler", "rng", "config", "meta"):
        assert key in last
    csv = Path(f"{out}/metrics.csv").read_text().splitlines()
    assert len(csv) == 4 and csv[0].startswith("epoch,step,train/epoch_loss")


@pytest.mark.slow
def test_resume_continues_from_the_saved_step_with_identical_optimizer_state(tiny):
    fit(load_config(None, [*tiny, "train.epochs=1"]))
    saved = checkpoint.load(f"{run_dir(tiny)}/last.pt")

    seen = {}
    original = checkpoint.restore_training_state

    def spy(state, model, optimizer, scheduler, scaler, progress, *rest):
        original(state, model, optimizer, scheduler, scaler, progress, *rest)
        seen["optimizer"] = copy.deepcopy(optimizer.state_dict())  # training mutates it
        seen["step"] = progress.step

    checkpoint.restore_training_state = spy
    try:
        result = fit(load_config(None, [*tiny, "train.epochs=2", "train.resume=auto"]))
    finally:
        checkpoint.restore_training_state = original
    assert seen["step"] == saved["progress"]["step"]
    for a, b in zip(
        seen["optimizer"]["state"].values(), saved["optimizer"]["state"].values(), strict=True
    ):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["step"], b["step"])
    assert result["step"] == 2 * saved["progress"]["step"]


def weights(path):
    return checkpoint.load(path)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", ["epoch", "mid-epoch"])
def test_resume_is_bitwise_exact(tmp_path, tiny, stop_at, monkeypatch):
    """N epochs straight == stopped (at an epoch boundary or mid-epoch) then resumed."""
    exact = [*tiny, "run.deterministic=true", "train.epochs=3", "model.dropout=0.3"]
    straight = fit(load_config(None, [*exact, "run.name=straight"]))
    steps_per_epoch = straight["step"] // 3
    stop = steps_per_epoch if stop_at == "epoch" else steps_per_epoch + steps_per_epoch // 2 + 1
    stopping = stop_after(monkeypatch, stop)
    first = fit(load_config(None, [*exact, *stopping, "run.name=split"]))
    assert first["step"] == stop and first["stopped"] == "SIGTERM"
    resumed = fit(load_config(None, [*exact, "run.name=split", "train.resume=auto"]))
    assert resumed["step"] == straight["step"]
    assert resumed["metrics"] == straight["metrics"]
    assert_same_weights(
        weights(f"{run_dir(tiny, 'straight')}/last.pt"),
        weights(f"{run_dir(tiny, 'split')}/last.pt"),
    )


def test_gradient_accumulation_and_bf16_autocast_on_cpu(tiny):
    result = fit(load_config(None, [*tiny, "train.amp=bf16", "train.grad_accum_steps=2"]))
    assert result["epoch"] == 2 and result["metrics"]["loss"] < 10
    # 256 samples / batch 16 = 16 micro-batches per epoch, 2 per optimizer step.
    assert result["step"] == 2 * 8


def test_gradient_accumulation_trains_on_every_batch_of_the_epoch(tiny, monkeypatch):
    """14 micro-batches at grad_accum_steps=3: four steps of 3, then one of the 2 left over
    (they were dropped), whose gradient is the mean of those 2 batches' (divided by 2)."""
    reads, steps = [], []  # the training batches read; (parameters, gradients) at each step
    getitem, make_optimizer = InMemoryDataset.__getitem__, trainer.build_optimizer

    def reading(self, i):
        if isinstance(i, list) and len(self) == 224:  # a batch of the training set
            reads.append((i, getitem(self, i)))
        return getitem(self, i)

    def recording(model, *args, **kwargs):
        optimizer = make_optimizer(model, *args, **kwargs)
        named = list(model.named_parameters())

        def before_step(*_):
            steps.append({n: (p.detach().clone(), p.grad.clone()) for n, p in named})

        optimizer.register_step_pre_hook(before_step)
        return optimizer

    monkeypatch.setattr(InMemoryDataset, "__getitem__", reading)
    monkeypatch.setattr(trainer, "build_optimizer", recording)
    plain = ["model.name=mlp", "model.dropout=0", "train.grad_clip=0", "train.epochs=1"]
    args = [*tiny, *plain, "data.train_size=224", "train.grad_accum_steps=3"]
    result = fit(load_config(None, args))
    assert result["step"] == len(steps) == 5  # ceil(14 / 3)
    assert sorted(i for indices, _ in reads for i in indices) == list(range(224))
    model = result["model"]
    for name, (value, _) in steps[-1].items():
        model.get_parameter(name).data.copy_(value)  # as it was before the last step
    model.zero_grad()
    for _, (x, y) in reads[-2:]:
        (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
    for name, (_, grad) in steps[-1].items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, msg=name)


def test_max_steps_mid_epoch_validates_the_final_model_and_ends_the_lr_at_its_floor(tiny):
    """train.max_steps=10 ends the run inside epoch 1: the summary, runs.csv and best.pt
    describe the model it ends with, and the schedule, planned for 10 steps, ends at the
    floor lr (it spanned both epochs and stopped mid-cosine)."""
    cfg = load_config(None, [*tiny, "train.max_steps=10"])
    result = fit(cfg)
    out = Path(run_dir(tiny))
    final = evaluate_checkpoint(str(out / "last.pt"))
    assert final["step"] == result["step"] == 10 and result["stopped"] == "max_steps"
    metrics = {k: v for k, v in final.items() if k not in ("checkpoint", "step")}
    assert result["metrics"] == metrics
    best = checkpoint.load(out / "best.pt")
    assert best["progress"]["step"] == 10 and best["progress"]["metrics"] == metrics
    header, row = (out.parent / "runs.csv").read_text().splitlines()
    recorded = dict(zip(header.split(","), row.split(","), strict=True))
    for column in ("val_acc", "best_val_acc"):  # runs.csv keeps 6 significant digits
        assert float(recorded[column]) == pytest.approx(metrics["acc"], abs=1e-6)
    floor = cfg.train.lr * cfg.train.min_lr_ratio  # train.lr_scaling=none: the lr as given
    assert checkpoint.load(out / "last.pt")["scheduler"]["_last_lr"] == pytest.approx(
        [floor, floor]
    )
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].split(",")[:2] == ["0.625", "10"]  # 10 of 16 steps


def test_a_signal_at_the_max_steps_step_still_ends_the_run_validated(tiny, monkeypatch):
    """A stop request on the very step train.max_steps ends: the run is complete, so it is
    validated and recorded (a resume would otherwise call it complete with older metrics)."""
    extra = stop_after(monkeypatch, 10)
    result = fit(load_config(None, [*tiny, *extra, "train.max_steps=10"]))
    out = Path(run_dir(tiny))
    final = evaluate_checkpoint(str(out / "last.pt"))
    assert result["stopped"] == "max_steps" and final["step"] == 10
    assert result["metrics"] == {k: v for k, v in final.items() if k not in ("checkpoint", "step")}
    assert (out.parent / "runs.csv").exists()


def test_fp16_on_cpu_is_refused_before_anything_is_written(tiny):
    with pytest.raises(ConfigError, match="train.amp=fp16 needs a GPU"):
        fit(load_config(None, [*tiny, "train.amp=fp16"]))
    assert not os.path.exists(run_dir(tiny))


def test_existing_run_is_never_overwritten(tiny):
    fit(load_config(None, [*tiny, "train.max_steps=1"]))
    before = checkpoint.load(f"{run_dir(tiny)}/last.pt")["model"]
    with pytest.raises(ConfigError, match="already exists.*train.resume=auto.*run.name="):
        fit(load_config(None, tiny))
    assert_same_weights(before, checkpoint.load(f"{run_dir(tiny)}/last.pt")["model"])


@pytest.mark.slow
def test_keep_last_prunes_old_step_files_but_keeps_best(tiny):
    fit(load_config(None, [*tiny, "train.epochs=4", "train.keep_last=2"]))
    out = run_dir(tiny)
    steps = sorted(p.name for p in Path(out).glob("step-*.pt"))
    assert len(steps) == 2
    assert checkpoint.load(f"{out}/best.pt")["progress"]["best"] is not None


@pytest.mark.slow
def test_evaluate_script_prints_the_metrics_of_a_checkpoint(tiny):
    fit(load_config(None, tiny))
    best = f"{run_dir(tiny)}/best.pt"
    proc = run_script("scripts/evaluate.py", "--checkpoint", best, "--json", "run.device=cpu")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["count"] == 96 and 0 <= metrics["acc"] <= 1
    assert metrics["step"] == checkpoint.load(best)["progress"]["step"]


@pytest.mark.slow
def test_train_script_runs_from_the_command_line(tiny):
    proc = run_script("scripts/train.py", *tiny, "train.epochs=1", "run.threads=1")
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1/1" in proc.stdout
    assert "| cpu x 1 | CPU threads 1 | amp off |" in proc.stdout  # the run line


# What only some runs use, each costing start-up time when imported: torch's distributed
# checkpoints, sharding and DTensor (with sympy: over a second together), plots, the trackers,
# TensorBoard, optional libraries and the project's own tools.
OPTIONAL = (
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",  # feature: fsdp
    "torch.distributed.tensor",
    "torch.distributed._composable",
    "torch.utils.tensorboard",
    "matplotlib",
    "onnx",  # feature: export
    "onnxscript",  # feature: export
    "onnxruntime",  # feature: export
    "wandb",  # feature: trackers
    "mlflow",  # feature: trackers
    "optuna",  # feature: sweeps
    # The tools a training run does not use (its entry point is tools/train.py).
    *(
        f"{trainer.__package__}.tools.{tool}"
        for tool in (
            "compare",
            "consolidate",  # feature: fsdp
            "export",  # feature: export
            "formats",  # feature: export
            "inference",
            "predict",
            "predict_inputs",
            "report",
            "runs_table",
            "serving",  # feature: export
            "sweep",  # feature: sweeps
            "sweep_plan",  # feature: sweeps
            "sweep_report",  # feature: sweeps
            "sweep_manifest",  # feature: sweeps
            "sweep_optuna",  # feature: sweeps
        )
    ),
)

# In a fresh process: the modules loaded once a run is built (package imported, config loaded),
# then once a hand-written loop took a step (torch's optimizer imports torch._dynamo, which
# imports torch's sharding and DTensor: every torch loop pays that), then after a tiny plain run.
_BUILD = """
import json, sys
from PKG import trainer
from PKG.config import load_config
load_config(None, OVERRIDES)
loaded = {"built": sorted(sys.modules)}
"""
_RUN = """
import torch
net = torch.nn.Linear(2, 1)
optimizer = torch.optim.AdamW(net.parameters(), fused=True)
net(torch.zeros(1, 2)).sum().backward()
optimizer.step()
loaded["loop"] = sorted(sys.modules)
from PKG.tools.train import train_main
assert train_main(OVERRIDES) == 0
loaded["run"] = sorted(sys.modules)
"""


def _optional_loaded(code: str, overrides: list[str]) -> dict[str, set[str]]:
    """{moment: the OPTIONAL modules loaded by then} of `code` run in a fresh process."""
    code = code.replace("PKG", trainer.__package__).replace("OVERRIDES", repr(overrides))
    proc = run_script("-c", code + "print(json.dumps(loaded))")
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        moment: {m for m in modules for o in OPTIONAL if m == o or m.startswith(o + ".")}
        for moment, modules in loaded.items()
    }


def test_building_a_run_loads_no_optional_path(tiny):
    assert _optional_loaded(_BUILD, tiny) == {"built": set()}


@pytest.mark.slow
def test_a_plain_run_loads_no_optional_path(tiny):
    loaded = _optional_loaded(_BUILD + _RUN, [*tiny, "train.epochs=1", "run.threads=1"])
    assert loaded["built"] == set()
    # matplotlib draws curves.png at the epoch's end (see test_plots.py): the one optional path
    # of a plain run, once it has trained.
    drawn = (Path(run_dir(tiny)) / "curves.png").exists()
    extra = loaded["run"] - loaded["loop"]
    assert {m for m in extra if not (drawn and m.split(".")[0] == "matplotlib")} == set()


@pytest.mark.parametrize(
    ("main", "example"),
    [
        (train_main, "train.epochs=3"),
        (evaluate_main, "run.device=cpu data.num_workers=4"),
        (smoke_main, "run.device=cpu model.name=mlp"),
    ],
)
def test_each_script_shows_overrides_that_mean_something_to_it(main, example, capsys):
    args = (ROOT, ["--help"]) if main is smoke_main else (["--help"],)
    with pytest.raises(SystemExit):
        main(*args)
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"e.g. {example}" in help_text
    if main is not train_main:  # training settings do nothing when evaluating
        assert "train.epochs" not in help_text


def test_smoke_overrides_come_after_the_command_line_and_say_so(monkeypatch, capsys):
    """$SMOKE_OVERRIDES (docs/testing.md): how the documented commands run, as written, at
    smoke sizes; split as a shell splits it, over the command line's, one line on rank 0."""
    from {{ cookiecutter.package_name }}.tools.cli import smoke_overrides

    monkeypatch.setenv("SMOKE_OVERRIDES", "train.max_steps=3 'run.loggers=[csv]'")
    assert train_main(["--show-config", "train.max_steps=50", "train.epochs=4"]) == 0
    shown = capsys.readouterr()
    assert "\n  max_steps: 3  #" in shown.out and "\n  epochs: 4" in shown.out
    assert "  loggers: [csv]  #" in shown.out
    line = "SMOKE_OVERRIDES: train.max_steps=3 run.loggers=[csv] (after the command line's)\n"
    assert shown.err == line
    monkeypatch.setenv("RANK", "1")  # another rank of a torchrun: the same overrides, silently
    assert smoke_overrides() == ["train.max_steps=3", "run.loggers=[csv]"]
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, tiny):
    x, y = torch.randn(64, 3, 8, 8), torch.arange(64) % 4
    for name, inputs in (
        ("good", x),
        ("bad", x.clone().index_fill_(0, torch.tensor([40]), float("nan"))),
    ):
        (tmp_path / name).mkdir()
        for split in ("train", "val"):
            torch.save({"x": inputs, "y": y}, tmp_path / name / f"{split}.pt")
    data = tiny_with(tiny, "data.name=tensors", "train.batch_size=8", "data.num_workers=0")
    fit(load_config(None, [*data, "train.epochs=1", f"data.root={tmp_path / 'good'}"]))
    good = checkpoint.load(f"{run_dir(tiny)}/last.pt")
    proc = run_script(
        "scripts/train.py",
        *data,
        "train.epochs=2",
        "train.resume=auto",
        f"data.root={tmp_path / 'bad'}",
    )
    assert proc.returncode == 2
    assert "loss is not finite at step" in proc.stderr and "last good checkpoint" in proc.stderr
    assert_same_weights(good["model"], checkpoint.load(f"{run_dir(tiny)}/last.pt")["model"])


@pytest.mark.slow
def test_smoke_script_passes():
    proc = run_script("scripts/smoke.py", "run.device=cpu", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke test passed" in proc.stdout


@pytest.mark.slow
def test_checkpoint_errors(tmp_path, tiny):
    fit(load_config(None, [*tiny, "train.max_steps=1"]))
    good = f"{run_dir(tiny)}/last.pt"
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(Path(good).read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="is not a checkpoint .corrupt, truncated"):
        checkpoint.load(truncated)
    pickled = tmp_path / "pickled.pt"
    torch.save({"model": {}, "payload": ROOT}, pickled)  # a Path: arbitrary pickled object
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        checkpoint.load(pickled)


@pytest.mark.slow
def test_tensorboard_events_and_the_runs_table_are_written(tiny):
    fit(load_config(None, [*tiny, "run.loggers=[csv,tensorboard]"]))
    events = list(Path(run_dir(tiny), "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    runs = Path(load_config(None, tiny).run.output_dir, "runs.csv").read_text().splitlines()
    assert runs[0].startswith("finished,run,task,model") and len(runs) == 2


def test_metrics_csv_keeps_every_column_when_a_resumed_run_logs_other_ones(tmp_path):
    """A run resumed on another device logs another memory column: the file is rewritten
    with both, and no value sits under another column's header."""
    import csv

    from {{ cookiecutter.package_name }}.utils.logger import _append_csv

    path = tmp_path / "metrics.csv"
    _append_csv(path, {"epoch": 1, "val/loss": 0.5, "memory/cuda_peak_mb": 100.0})
    _append_csv(path, {"epoch": 2, "val/loss": 0.4, "memory/rss_peak_mb": 300.0})
    _append_csv(path, {"epoch": 3, "val/loss": 0.3, "memory/rss_peak_mb": 310.0})
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["memory/cuda_peak_mb"] for r in rows] == ["100", "", ""]
    assert [r["memory/rss_peak_mb"] for r in rows] == ["", "300", "310"]
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
