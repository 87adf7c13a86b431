"""GPU paths: run on a CUDA machine (`make test`), skipped elsewhere. Also torch.compile."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.trainer import fit


def cuda(tiny: list[str]) -> list[str]:
    return [*tiny, "run.device=cuda", "data.num_workers=2"]


@requires_cuda
@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_trains_on_cuda_with_each_amp_mode(tiny, amp):
    if amp == "bf16" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 is emulated below compute capability 8.0; the trainer refuses it")
    result = fit(load_config(None, [*cuda(tiny), f"train.amp={amp}", "train.channels_last=true"]))
    assert result["epoch"] == 2 and result["metrics"]["loss"] < 10
    last = load_config(None, tiny).run.output_dir + "/default/last.pt"
    state = checkpoint.load(last)
    # Only fp16 needs loss scaling; a disabled GradScaler saves an empty state.
    assert (state["scaler"] != {}) == (amp == "fp16")
    assert len(state["rng"][0]["cuda"]) == torch.cuda.device_count()


@requires_cuda
def test_cuda_checkpoint_resumes_on_cpu(tiny):
    fit(load_config(None, [*cuda(tiny), "train.epochs=1"]))
    result = fit(load_config(None, [*tiny, "train.resume=auto"]))  # run.device=cpu
    assert result["epoch"] == 2


@pytest.mark.slow
def test_compiled_model_trains_and_saves_plain_keys(tiny):
    """torch.compile wraps the model as _orig_mod; checkpoints must not carry the prefix."""
    fit(load_config(None, [*tiny, "train.compile=true", "train.max_steps=3"]))
    state = checkpoint.load(load_config(None, tiny).run.output_dir + "/default/last.pt")
    assert state["progress"]["step"] == 3
    assert not any(k.startswith("_orig_mod.") for k in state["model"])
