"""Device and launch rules that only a GPU, a Mac or torchrun would reach, tested on CPU by
faking what torch reports: bf16 where it is emulated, cuda:N under torchrun, MPS autocast."""

from __future__ import annotations

import contextlib

import pytest
import torch

from {{ cookiecutter.package_name }} import distributed
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.utils import device as devices

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """Pretend cuda:0 is a GPU of the compute capability the test sets."""

    def set_capability(major: int, minor: int, name: str) -> None:
        monkeypatch.setattr(
            torch.cuda, "get_device_capability", lambda device=None: (major, minor)
        )
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        # What torch itself says on such a GPU: bf16 "supported" through emulation.
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)

    return set_capability


def test_bf16_is_refused_where_the_gpu_only_emulates_it(gpu):
    gpu(7, 0, "Tesla V100-SXM2-32GB")
    assert not devices.native_bf16(CUDA)
    assert devices.default_amp(CUDA) == "fp16"
    with pytest.raises(ConfigError, match=r"bf16 is emulated .slow. on Tesla V100.*7\.0.*fp16"):
        devices.check_amp("bf16", CUDA)
    devices.check_amp("fp16", CUDA)  # the way out is accepted


def test_bf16_is_chosen_on_ampere_and_newer(gpu):
    gpu(8, 0, "NVIDIA A100")
    assert devices.native_bf16(CUDA) and devices.default_amp(CUDA) == "bf16"
    devices.check_amp("bf16", CUDA)


def test_amp_off_builds_no_autocast_at_all(monkeypatch):
    """torch < 2.5 refuses torch.autocast("mps", ...) even disabled: with amp off none is made."""

    def refuse(*args, **kwargs):
        raise RuntimeError("User specified an unsupported autocast device_type 'mps'")

    monkeypatch.setattr(torch, "autocast", refuse)
    context = devices.autocast(torch.device("mps"), "off")
    assert isinstance(context, contextlib.nullcontext)


def test_bf16_on_mps_needs_macos_14(monkeypatch):
    mps = torch.device("mps")
    monkeypatch.setattr(
        torch.backends.mps, "is_macos_or_newer", lambda major, minor: False, raising=False
    )
    with pytest.raises(ConfigError, match="emulated .slow. on MPS before macOS 14"):
        devices.check_amp("bf16", mps)
    monkeypatch.setattr(
        torch.backends.mps, "is_macos_or_newer", lambda major, minor: True, raising=False
    )
    devices.check_amp("bf16", mps)


def test_memory_is_named_for_what_it_measures():
    name, value = devices.memory_mb(torch.device("cpu"))
    assert name == "memory/rss_peak_mb" and value > 10


@pytest.mark.parametrize("device", ["cuda:1", "cuda:0"])
def test_one_gpu_index_for_several_ranks_is_refused(monkeypatch, device):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=f"run.device={device} would put all 2 ranks on one GPU"):
        distributed.setup(device)


@pytest.fixture
def threads(monkeypatch):
    """torch's thread count is process-wide: put it back after the test. No OMP_NUM_THREADS,
    and a LOCAL_WORLD_SIZE only where a test sets one."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    yield monkeypatch
    torch.set_num_threads(before)


@pytest.mark.parametrize(("cpus", "local", "expected"), [(8, None, 8), (8, "4", 2), (2, "4", 1)])
def test_auto_threads_share_this_process_cpus_among_local_ranks(threads, cpus, local, expected):
    threads.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    if local:  # torchrun's LOCAL_WORLD_SIZE: processes on this machine
        threads.setenv("LOCAL_WORLD_SIZE", local)
    assert devices.configure_threads(0) == expected
    assert torch.get_num_threads() == expected


def test_auto_threads_without_affinity_count_the_machine(threads):
    threads.delattr(devices.os, "sched_getaffinity", raising=False)
    threads.setattr(devices.os, "cpu_count", lambda: 6)
    assert devices.configure_threads(0, local_world_size=3) == 2


def test_explicit_threads_are_applied_even_with_omp_num_threads(threads):
    threads.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    threads.setenv("OMP_NUM_THREADS", "3")
    assert devices.configure_threads(1) == 1 and torch.get_num_threads() == 1
    assert devices.configure_threads(2) == 2 and torch.get_num_threads() == 2


@pytest.mark.parametrize("requested", [3, 10_000, 100_000])
def test_threads_beyond_the_usable_cpus_are_refused_before_torch_sees_them(threads, requested):
    """100,000 threads crashed the process (exit 139, no message) at its first operation."""
    before = torch.get_num_threads()
    threads.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with pytest.raises(ConfigError) as err:
        devices.configure_threads(requested)
    assert str(err.value) == (
        f"run.threads={requested} is more than the 2 CPUs this process may use (its affinity "
        "mask); use run.threads=2 or fewer, or 0 (auto)"
    )
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("cpus", "local", "limit"), [(2, None, 8), (8, "4", 8), (1, "4", 1)])
def test_loader_workers_are_bounded_by_the_cpus_of_the_machine(threads, cpus, local, limit):
    threads.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    if local:
        threads.setenv("LOCAL_WORLD_SIZE", local)
    devices.check_workers(limit)
    with pytest.raises(ConfigError, match=f"use data.num_workers={limit} or fewer"):
        devices.check_workers(limit + 1)


def test_auto_threads_keep_torchs_count_when_omp_num_threads_is_set(threads):
    torch.set_num_threads(3)
    threads.setenv("OMP_NUM_THREADS", "3")
    threads.setattr(devices.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert devices.configure_threads(0) == 3 and torch.get_num_threads() == 3
