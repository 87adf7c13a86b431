"""train.micro_batch_size: batches cut into micro-batches keep the step's math (the weights
of a whole-batch run, within float rounding), and with `auto` an out-of-memory error at any
step halves the micro-batch on every rank together, saved so a resume does not search again;
at a micro-batch of 1 the run stops with one line."""

from __future__ import annotations

import csv
import re
import textwrap

import pytest
import torch
from conftest import stop_after, tiny_run
from test_distributed import STANDALONE, torchrun
from torch import nn

from {{ cookiecutter.package_name }} import checkpoint, microbatch, parallel
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.microbatch import OutOfMemory
from {{ cookiecutter.package_name }}.trainer import fit

# No BatchNorm (the MLP), no dropout: the math is the same whatever the micro-batch.
EXACT = ["model.name=mlp", "model.dropout=0.0", "run.deterministic=true", "train.epochs=1"]
BACKED_OFF = (
    r"out of memory at step (\d+) with a micro-batch of (\d+): the step runs again at (\d+)"
)


class OutOfMemoryAbove(nn.Module):
    """A training forward pass over more than `rows` inputs raises CUDA's out-of-memory error,
    after the first `calls` training forward passes (a larger example later in a run)."""

    def __init__(self, net: nn.Module, rows: int, calls: int):
        super().__init__()
        self.net, self.rows, self.calls = net, rows, calls

    def forward(self, x):
        if self.training:
            self.calls -= 1
            if self.calls < 0 and len(x) > self.rows:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.net(x)


def fake_oom(monkeypatch, rows: int, calls: int = 0) -> None:
    wrap = parallel.wrap

    def wrap_with_a_limit(model, *args):
        ddp, net = wrap(model, *args)
        return ddp, OutOfMemoryAbove(net, rows, calls)

    monkeypatch.setattr(parallel, "wrap", wrap_with_a_limit)


def weights(tiny: list[str], name: str) -> dict:
    return checkpoint.load(f"{tiny_run(tiny, name)}/last.pt")["model"]


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_math(tiny, monkeypatch, capsys):
    fake_oom(monkeypatch, rows=5)  # batches of 16: 16 and 8 fail, 4 fits
    fit(load_config(None, [*tiny, *EXACT, "train.micro_batch_size=auto", "run.name=auto"]))
    out = capsys.readouterr().out
    assert re.findall(BACKED_OFF, out) == [("1", "16", "8"), ("1", "8", "4")]
    assert "in micro-batches of 4 (auto)" in out  # the summary
    monkeypatch.undo()
    fit(load_config(None, [*tiny, *EXACT, "train.micro_batch_size=4", "run.name=fixed"]))
    fit(load_config(None, [*tiny, *EXACT, "run.name=whole"]))
    backed_off, fixed, whole = (weights(tiny, n) for n in ("auto", "fixed", "whole"))
    # The retried step drops all it had done: the run is the one started at 4, bitwise.
    assert all(torch.equal(backed_off[k], fixed[k]) for k in fixed)
    # And it took the whole batches' steps, summed in another order.
    for k in whole:
        torch.testing.assert_close(backed_off[k], whole[k], rtol=1e-4, atol=1e-5)
    assert not all(torch.equal(backed_off[k], whole[k]) for k in whole)  # the parts were used
    state = checkpoint.load(f"{tiny_run(tiny, 'auto')}/last.pt")
    assert state["progress"]["micro_batch"] == 4
    with open(f"{tiny_run(tiny, 'auto')}/metrics.csv") as f:
        assert [row["train/micro_batch"] for row in csv.DictReader(f)] == ["4"]


def test_uneven_parts_are_weighted_by_their_size(tiny):
    # 16 = 5 + 5 + 5 + 1: an unweighted mean of the parts' means would give the 1 a third.
    fit(load_config(None, [*tiny, *EXACT, "train.micro_batch_size=5", "run.name=five"]))
    fit(load_config(None, [*tiny, *EXACT, "run.name=whole"]))
    five, whole = weights(tiny, "five"), weights(tiny, "whole")
    for k in whole:
        torch.testing.assert_close(five[k], whole[k], rtol=1e-4, atol=1e-5)


def test_out_of_memory_later_in_the_run_backs_off_there(tiny, monkeypatch, capsys):
    fake_oom(monkeypatch, rows=10, calls=6)  # one forward per step at 16: step 7's fails
    fit(load_config(None, [*tiny, *EXACT, "train.micro_batch_size=auto"]))
    assert re.findall(BACKED_OFF, capsys.readouterr().out) == [("7", "16", "8")]


def test_out_of_memory_at_a_micro_batch_of_one_stops_with_the_fixes(tiny, monkeypatch):
    fake_oom(monkeypatch, rows=0)
    cfg = load_config(None, [*tiny, *EXACT, "train.micro_batch_size=auto"])
    with pytest.raises(OutOfMemory, match=r"micro-batch of 1 .*expandable_segments:True"):
        fit(cfg)
    # A number is what the user asked for: no search, and the line offers auto.
    cfg = load_config(None, [*tiny, *EXACT, "train.micro_batch_size=4"])
    with pytest.raises(OutOfMemory, match=r"micro-batch of 4 .*try train.micro_batch_size=auto"):
        fit(cfg)


def test_other_errors_pass_through(tiny, monkeypatch):
    wrap = parallel.wrap

    def broken(model, *args):
        ddp, net = wrap(model, *args)
        net.forward = lambda x: (_ for _ in ()).throw(RuntimeError("a real bug"))
        return ddp, net

    monkeypatch.setattr(parallel, "wrap", broken)
    with pytest.raises(RuntimeError, match="a real bug"):
        fit(load_config(None, [*tiny, *EXACT, "train.micro_batch_size=auto"]))


def test_the_allocators_errors_are_recognised():
    with pytest.raises(RuntimeError) as real:  # the CPU allocator's, for real: 1 PiB
        torch.empty(2**50, dtype=torch.uint8)
    assert microbatch.is_oom(real.value)
    assert microbatch.is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert microbatch.is_oom(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not microbatch.is_oom(RuntimeError("shape mismatch"))
    assert not microbatch.is_oom(ValueError("can't allocate memory"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.micro_batch_size=big"], "train.micro_batch_size expects int or auto"),
        (["train.micro_batch_size=17"], "between 1 and train.batch_size, got 17"),
        (["train.micro_batch_size=-1"], "between 1 and train.batch_size, got -1"),
        (["train.micro_batch_size=auto", "train.sync_bn=true"], "train.sync_bn=true"),
    ],
)
def test_bad_settings_are_refused_in_one_line(tiny, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [*tiny, *overrides])


@pytest.mark.slow
def test_a_resume_keeps_the_micro_batch_and_is_bitwise(tiny, monkeypatch, capsys):
    exact = [*EXACT, "train.epochs=2", "train.micro_batch_size=auto", "run.log_every=1"]
    fake_oom(monkeypatch, rows=5)
    fit(load_config(None, [*tiny, *exact, "run.name=straight"]))
    stopping = stop_after(monkeypatch, 5)
    fit(load_config(None, [*tiny, *exact, *stopping, "run.name=split"]))
    monkeypatch.undo()  # the memory is there now: the saved micro-batch is used as it is
    capsys.readouterr()
    fit(load_config(None, [*tiny, *exact, "run.name=split", "train.resume=auto"]))
    out = capsys.readouterr().out
    assert "in micro-batches of 4 (auto)" in out.splitlines()[0] + out
    assert re.search(r"resumed at step 5", out) and not re.search(BACKED_OFF, out)
    a, b = weights(tiny, "straight"), weights(tiny, "split")
    assert all(torch.equal(a[k], b[k]) for k in a)


# Rank 1 alone runs out of memory, from its 3rd training forward pass (step 3) on; each rank
# saves the weights it ended with.
ONE_RANK = textwrap.dedent(
    """
    import os, sys
    import torch
    from {{ cookiecutter.package_name }} import parallel, trainer
    from {{ cookiecutter.package_name }}.tools.train import train_main

    wrap, fit, calls = parallel.wrap, trainer.fit, []

    class Limit(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            if self.training and os.environ["RANK"] == "1":
                calls.append(1)
                if len(calls) >= 3 and len(x) > 5:
                    raise torch.OutOfMemoryError("CUDA out of memory (rank 1)")
            return self.net(x)

    def limited(model, *args):
        ddp, net = wrap(model, *args)
        return ddp, Limit(net)

    def fit_and_dump(cfg, *args):
        result = fit(cfg, *args)
        dump = {"model": result["model"].state_dict()}
        torch.save(dump, os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".pt"))
        return result

    if "train.micro_batch_size=auto" in sys.argv:
        parallel.wrap = limited
    trainer.fit = fit_and_dump
    raise SystemExit(train_main(sys.argv[2:]))
    """
)


@pytest.mark.slow
def test_out_of_memory_on_one_rank_backs_off_on_both(tiny, tmp_path):
    script = tmp_path / "one_rank_oom.py"
    script.write_text(ONE_RANK)
    args = [*tiny, *EXACT]
    (tmp_path / "auto").mkdir()
    (tmp_path / "ddp").mkdir()
    proc = torchrun(
        STANDALONE, script, tmp_path / "auto", *args, "train.micro_batch_size=auto", "run.name=a"
    )  # bounded: torchrun() fails after 180 s, a rank left waiting would hang there
    assert re.findall(BACKED_OFF, proc.stdout) == [("3", "16", "8"), ("3", "8", "4")]
    torchrun(STANDALONE, script, tmp_path / "ddp", *args, "run.name=d")
    auto = [torch.load(tmp_path / "auto" / f"rank{r}.pt")["model"] for r in range(2)]
    ddp = torch.load(tmp_path / "ddp" / "rank0.pt")["model"]
    assert all(torch.equal(auto[0][k], auto[1][k]) for k in ddp)  # the same steps on both
    for k in ddp:  # and DDP's: the gradients averaged over ranks as DDP averages them
        torch.testing.assert_close(auto[0][k], ddp[k], rtol=1e-4, atol=1e-5)
    state = checkpoint.load(f"{tiny_run(tiny, 'a')}/last.pt")
    assert state["progress"]["micro_batch"] == 4
