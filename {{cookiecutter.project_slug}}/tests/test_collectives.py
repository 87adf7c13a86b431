"""Every tensor handed to a collective is on the device the process group serves.

On GPUs the group is NCCL, which serves CUDA tensors only: a tensor made without `device=`
(on the CPU) fails there, and nowhere on a CPU-only machine, whose gloo group serves the CPU.
These tests make the same mistake fail on the CPU: distributed.py checks each tensor against
the device type the group serves, and the code paths that call collectives run inside
`torch.device("meta")`, where a tensor made without `device=` lands on meta instead of the CPU.
A lint test keeps every collective inside distributed.py, where the check is.
"""

from __future__ import annotations

import ast
from copy import deepcopy  # feature: fsdp
from types import SimpleNamespace

import pytest
import torch
from conftest import NEEDS_TORCH_2_7, ROOT  # feature: fsdp
from conftest import ROOT  # feature: !fsdp
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }} import distributed, fsdp  # feature: fsdp
from {{ cookiecutter.package_name }} import distributed  # feature: !fsdp
from {{ cookiecutter.package_name }}.checkpoint import Progress
from {{ cookiecutter.package_name }}.config import TrainConfig, load_config  # feature: fsdp
from {{ cookiecutter.package_name }}.config import load_config  # feature: !fsdp
from {{ cookiecutter.package_name }}.distributed import DistInfo, StopVote
from {{ cookiecutter.package_name }}.loop import read_losses
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.tasks.classification import Classification, Options
from {{ cookiecutter.package_name }}.tools import report
from {{ cookiecutter.package_name }}.utils.signals import StopSignal
from {{ cookiecutter.package_name }}.validation import evaluate

CPU = torch.device("cpu")


@pytest.fixture
def grouped():
    """The default CNN, tiny, on one process in a one-rank gloo group, left at the end."""  # feature: !fsdp
    """The default CNN, tiny, on one process in a one-rank gloo group, left at the end;  # feature: fsdp
    sharded under fsdp (shard() joins the group, as one process does)."""  # feature: fsdp
    torch.manual_seed(0)
    cfg = load_config(None, ["model.width=4", "model.depth=1"])
    net = build_model(cfg.model, torch.randn(2, 3, 8, 8), 4)
    try:
        # >>> fsdp
        train = TrainConfig(strategy="fsdp")
        yield fsdp.shard(lambda: deepcopy(net).to("meta"), lambda: net, train, CPU)
        # <<< fsdp
        # >>> !fsdp
        distributed.join_alone(CPU)
        yield net
        # <<< !fsdp
    finally:
        distributed.teardown()


@NEEDS_TORCH_2_7  # FSDP2 on the CPU  # feature: fsdp
def test_a_tensor_on_another_device_than_the_group_s_is_refused_by_name(grouped):
    for collective in (distributed.all_reduce_sum, distributed.all_reduce_max):
        with pytest.raises(RuntimeError, match="on meta.* serves cpu"):
            collective(torch.ones(2, device="meta"))
    assert distributed.all_reduce_sum(torch.ones(2)).tolist() == [1.0, 1.0]  # on cpu: fine


class Batches(list):
    """A validation loader whose batches were read before the test: only what it hands a
    collective is made under torch.device("meta")."""

    dataset = None


@NEEDS_TORCH_2_7  # FSDP2 on the CPU  # feature: fsdp
def test_every_collective_of_a_run_gets_its_tensor_on_the_run_s_device(grouped):
    """What a run calls between ranks (evaluation with the report's collector, the loss log
    and stop vote, BatchNorm statistics) with new tensors on meta by default: each must put
    what it hands a collective on the run's device.
    Under fsdp also its validation loader; checkpoint.sharded.save_shards is left out:  # feature: fsdp
    torch.distributed.checkpoint itself makes tensors without device=, in objects it  # feature: fsdp
    pickles, which no group serves anyway.  # feature: fsdp
    """
    net = grouped
    data = TensorDataset(torch.randn(5, 3, 8, 8), torch.arange(5) % 4)
    batches = Batches(DataLoader(data, batch_size=2))  # a DataLoader makes a seed per epoch
    batches.dataset = data
    task = Classification(Options(), SimpleNamespace(num_classes=4))
    stop = StopSignal()
    loop = SimpleNamespace(device=CPU, stop=stop, progress=Progress(step=3), dist=DistInfo())
    loop.train = SimpleNamespace(on_nonfinite="skip")  # its collectives too
    losses = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]
    collector = report.Collector("classification", 4, CPU)
    with torch.device("meta"):
        loader = batches
        loader = fsdp.even_batches(batches, net, CPU)  # feature: fsdp
        metrics = evaluate(net, loader, task, CPU, observe=collector)
        collector.finish()
        distributed.sync_buffers(net)
        mean, stopped = read_losses(loop, losses, 3)
        voted = StopVote(stop, CPU, 3)(4)
    assert len(loader) == 3 and metrics["count"] == 5 and collector.confusion.sum() == 5
    assert (mean, stopped, voted) == (2.0, False, False)


# What only distributed.py may call: the collectives (so each goes through its device check)
# and the making of groups (so it knows which device a group serves).
GUARDED = {
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "init_process_group",
    "irecv",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
}


def distributed_calls(path) -> list[str]:
    """`name` of each `dist.name` / `torch.distributed.name` in GUARDED the file uses, and
    each such name imported from torch.distributed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in GUARDED:
            owner = ast.unparse(node.value)
            if owner in ("dist", "torch.distributed"):
                found.append(f"{owner}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [alias.name for alias in node.names if alias.name in GUARDED]
    return found


def test_only_distributed_py_calls_collectives_or_makes_process_groups():
    package = ROOT / "{{ cookiecutter.package_name }}"
    files = [*package.rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    offenders = {
        str(path.relative_to(ROOT)): calls
        for path in files
        if path.name != "distributed.py" and (calls := distributed_calls(path))
    }
    assert offenders == {}
    assert distributed_calls(package / "distributed.py")  # the scan does find them
