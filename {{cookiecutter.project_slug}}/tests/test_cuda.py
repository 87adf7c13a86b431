"""CUDA paths: marked `cuda` (`pytest -m cuda` on a GPU runs them), the
GPU-only ones skipped elsewhere; torch.compile, on the GPU where there is one; and TF32 as
train.tf32 sets it, whose flags are torch's and testable without a GPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import requires_cuda

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.trainer import fit
from {{ cookiecutter.package_name }}.utils import device as devices

pytestmark = pytest.mark.cuda
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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
    """torch.compile wraps the model as _orig_mod; checkpoints must not carry the prefix. On
    the GPU where there is one (inductor's triton kernels), else on the CPU."""
    fit(
        load_config(
            None, [*tiny, f"run.device={DEVICE}", "train.compile=true", "train.max_steps=3"]
        )
    )
    state = checkpoint.load(load_config(None, tiny).run.output_dir + "/default/last.pt")
    assert state["progress"]["step"] == 3
    assert not any(k.startswith("_orig_mod.") for k in state["model"])


@pytest.fixture
def tf32_flags():
    """Leaves torch's TF32 flags as torch starts (they are process-wide): cuDNN on, which
    set_tf32(True) also records, matmuls off."""
    yield
    devices.set_tf32(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "none"


@pytest.mark.parametrize("enabled", [False, True])
def test_tf32_is_set_through_the_fp32_precision_flags_in_step_with_the_legacy_ones(
    enabled, tf32_flags
):
    """torch >= 2.9 has per-operation fp32_precision flags, the allow_tf32 flags being the
    legacy API; set_tf32 sets both without a warning, so that a later reader of either (torch's
    own get_float32_matmul_precision, inductor, another library) neither warns nor raises
    ("mix of the legacy and new APIs")."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devices.set_tf32(not enabled)
        devices.set_tf32(enabled)
        read = (torch.get_float32_matmul_precision(), cuda.allow_tf32, cudnn.allow_tf32)
    assert read == (("high", True, True) if enabled else ("highest", False, False))
    if hasattr(cuda, "fp32_precision"):
        precision = "tf32" if enabled else "ieee"
        assert cuda.fp32_precision == cudnn.conv.fp32_precision == precision
        assert cudnn.rnn.fp32_precision == precision


def test_training_sets_tf32_as_train_tf32_says(monkeypatch, tf32_flags):
    """configure_backends (every run's start) on a CUDA device, its GPU calls replaced."""
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    devices.configure_backends(torch.device("cuda", 0), tf32=False, deterministic=True)
    assert torch.get_float32_matmul_precision() == "highest"
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cudnn.benchmark
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: the fp32_precision flags
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    devices.configure_backends(torch.device("cuda", 0), tf32=True, deterministic=False)
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
