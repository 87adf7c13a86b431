"""A resume that changes train.channels_last continues the same training: the optimizer's
moments take their parameters' new memory layout (the fused AdamW step pairs elements by
memory offset), so the run matches one resumed in the old layout to float rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import stop_after

from {{ cookiecutter.package_name }} import trainer
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.trainer import fit

# The same sums in another layout round differently: measured 2.4e-7 on the weights after 12
# steps. A moment left in the old layout is added to the wrong elements: 0.02 then.
TOLERANCE = 1e-5


def resume(args: list[str], name: str, start: Path, monkeypatch, layout: bool) -> tuple:
    """Resume `start` as run `name` with train.channels_last=`layout`: (result, optimizer)."""
    built, build = [], trainer.build_optimizer
    monkeypatch.setattr(trainer, "build_optimizer", _recording(build, built))
    flag = f"train.channels_last={str(layout).lower()}"
    result = fit(load_config(None, [*args, f"run.name={name}", f"train.resume={start}", flag]))
    return result, built[0]


def _recording(build, built: list):
    def recording(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    return recording


@pytest.mark.parametrize("saved_layout", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_resume_with_channels_last_changed_matches_a_resume_in_the_saved_layout(
    tiny, monkeypatch, saved_layout
):
    args = [*tiny, "run.deterministic=true", "train.epochs=1", "model.dropout=0"]
    with monkeypatch.context() as stopping:
        stop = stop_after(stopping, 4)
        flag = f"train.channels_last={str(saved_layout).lower()}"
        fit(load_config(None, [*args, *stop, flag, "run.name=start"]))
    start = Path(load_config(None, tiny).run.output_dir) / "start/last.pt"
    same, _ = resume(args, "same", start, monkeypatch, saved_layout)
    flipped, optimizer = resume(args, "flipped", start, monkeypatch, not saved_layout)
    assert same["step"] == flipped["step"] == 256 // 16
    for p, state in optimizer.state.items():  # every moment in its parameter's layout
        assert state["exp_avg"].stride() == state["exp_avg_sq"].stride() == p.stride()
    a, b = same["model"].state_dict(), flipped["model"].state_dict()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < TOLERANCE
    conv = next(p for p in flipped["model"].parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last) is not saved_layout
