"""train.on_nonfinite=skip: a step whose loss or gradient norm is not finite is dropped on
every rank together (no optimizer, schedule or average update), counted exactly, resumed
bitwise, and train.max_skipped such steps in a row stop the run with one line."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from conftest import stop_after, tiny_run
from test_distributed import STANDALONE, torchrun

from {{ cookiecutter.package_name }} import checkpoint, loop, parallel
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.nonfinite import NonFiniteLoss
from {{ cookiecutter.package_name }}.trainer import fit


def inject(monkeypatch, bad_steps: set[int]) -> None:
    """The gradient norm of optimizer steps `bad_steps` (1-based, of the whole run) is inf."""
    step, clip = loop.train_step, parallel.clip_grad_norm_
    due = [False]

    def train_step(run, *args):
        due[0] = run.progress.step + 1 in bad_steps
        return step(run, *args)

    def clip_grad_norm_(*args, **kwargs):
        norm = clip(*args, **kwargs)
        return torch.full_like(torch.as_tensor(norm), math.inf) if due[0] else norm

    monkeypatch.setattr(loop, "train_step", train_step)
    monkeypatch.setattr(parallel, "clip_grad_norm_", clip_grad_norm_)


def test_skipped_steps_update_nothing_and_are_counted(tiny, monkeypatch):
    inject(monkeypatch, {3, 20})  # 16 steps an epoch: one skip in each
    result = fit(load_config(None, [*tiny, "train.on_nonfinite=skip"]))
    state = checkpoint.load(f"{tiny_run(tiny)}/last.pt")
    assert state["progress"]["skipped"] == 2 and state["progress"]["skipped_in_a_row"] == 0
    # Two optimizer steps and two schedule steps fewer than the steps taken.
    adam = next(iter(state["optimizer"]["state"].values()))
    assert int(adam["step"]) == result["step"] - 2
    assert state["scheduler"]["last_epoch"] == result["step"] - 2
    with open(f"{tiny_run(tiny)}/metrics.csv") as f:
        rows = f.read().splitlines()
    header = rows[0].split(",")
    assert [r.split(",")[header.index("train/skipped_steps")] for r in rows[1:]] == ["1", "2"]


def test_max_skipped_in_a_row_stop_the_run_with_one_line(tiny, monkeypatch):
    inject(monkeypatch, {3, 4, 5})
    cfg = load_config(None, [*tiny, "train.on_nonfinite=skip", "train.max_skipped=2"])
    with pytest.raises(NonFiniteLoss, match=r"at 3 steps in a row, up to step 5 \(train\.max"):
        fit(cfg)


def test_stop_is_the_default_and_names_the_option(tiny, monkeypatch):
    step = loop.train_step

    def nan_at_step_3(run, *args):
        loss, norm = step(run, *args)
        return (loss * math.nan if run.progress.step == 2 else loss), norm

    monkeypatch.setattr(loop, "train_step", nan_at_step_3)
    with pytest.raises(NonFiniteLoss, match="step 3; .*train.on_nonfinite=skip"):
        fit(load_config(None, [*tiny, "run.log_every=1"]))


@pytest.mark.slow
def test_a_resume_across_a_skip_is_bitwise(tiny, monkeypatch):
    exact = [*tiny, "run.deterministic=true", "train.on_nonfinite=skip", "run.log_every=1"]
    inject(monkeypatch, {4})
    straight = fit(load_config(None, [*exact, "run.name=straight"]))
    stopping = stop_after(monkeypatch, 5)  # after the skip, mid-epoch
    fit(load_config(None, [*exact, *stopping, "run.name=split"]))
    monkeypatch.undo()
    inject(monkeypatch, {4})
    resumed = fit(load_config(None, [*exact, "run.name=split", "train.resume=auto"]))
    assert resumed["metrics"] == straight["metrics"]
    a = checkpoint.load(f"{tiny_run(tiny, 'straight')}/last.pt")
    b = checkpoint.load(f"{tiny_run(tiny, 'split')}/last.pt")
    assert a["progress"]["skipped"] == b["progress"]["skipped"] == 1
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# Rank 1 alone sees an inf gradient norm at step 3; each rank saves what it ended with.
ONE_RANK = textwrap.dedent(
    """
    import math, os, sys
    import torch
    from {{ cookiecutter.package_name }} import parallel, trainer
    from {{ cookiecutter.package_name }}.tools.train import train_main

    clip, fit, calls = parallel.clip_grad_norm_, trainer.fit, []

    def clip_grad_norm_(*args, **kwargs):
        calls.append(1)
        norm = clip(*args, **kwargs)
        bad = os.environ["RANK"] == "1" and len(calls) == 3
        return torch.full_like(torch.as_tensor(norm), math.inf) if bad else norm

    def fit_and_dump(cfg, *args):
        result = fit(cfg, *args)
        dump = {"model": result["model"].state_dict(), "step": result["step"]}
        torch.save(dump, os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".pt"))
        return result

    parallel.clip_grad_norm_, trainer.fit = clip_grad_norm_, fit_and_dump
    raise SystemExit(train_main(sys.argv[2:]))
    """
)


@pytest.mark.slow
def test_an_inf_on_one_rank_skips_the_step_on_both(tiny, tmp_path):
    script = tmp_path / "one_rank_inf.py"
    script.write_text(ONE_RANK)
    args = [*tiny, "model.name=mlp", "train.on_nonfinite=skip", "train.epochs=1"]
    torchrun(STANDALONE, script, tmp_path, *args)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    a, b = ranks[0]["model"], ranks[1]["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # one step less on both, not on one
    state = checkpoint.load(f"{tiny_run(tiny)}/last.pt")
    assert state["progress"]["skipped"] == 1
    adam = next(iter(state["optimizer"]["state"].values()))
    assert int(adam["step"]) == state["progress"]["step"] - 1
