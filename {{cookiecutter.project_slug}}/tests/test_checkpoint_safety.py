"""Checkpoints hold no code: a sharded checkpoint whose shard index (.metadata) or shard entry
is a pickle that reduces to os.system is refused with one line, wherever a checkpoint is
read (checkpoint.load, consolidation, train.resume=auto, train.init_from, the restore inside
dcp.load), and the command never runs; a real shard folder still loads.

The shard folders are written by dcp.save in this one process (no group, no FSDP): the same
files a sharded run writes, without its start-up.
"""

from __future__ import annotations

import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import TINY
from torch.distributed.checkpoint.state_dict import get_state_dict

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import shard_reader, sharded
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import CheckpointError
from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main
from {{ cookiecutter.package_name }}.trainer import fit

REFUSED = r"holds pickled Python objects \(posix\.system.*\), which weights_only loading refuses"


class Command:
    """Unpickles into running `touch marker`: what a hostile file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def save_shards(folder: Path, state: dict) -> None:
    with pytest.warns(UserWarning, match="torch.distributed is "):  # no group: meant here
        dcp.save(state, checkpoint_id=folder)


def poison_index(folder: Path, marker: Path) -> None:
    """The folder's real index, with one field that reduces to os.system."""
    index = pickle.loads((folder / ".metadata").read_bytes())
    index.storage_meta = Command(marker)
    (folder / ".metadata").write_bytes(pickle.dumps(index))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A one-step run: its last.pt (a full checkpoint) to build sharded ones from."""
    out = tmp_path_factory.mktemp("trained")
    fit(load_config(None, [*TINY, f"run.output_dir={out}", "train.max_steps=1"]))
    return out / "default/last.pt"


def sharded_run(trained: Path, run_dir: Path) -> Path:
    """A run folder whose last checkpoint is sharded: step-N.pt naming step-N.dcp/."""
    state = checkpoint.load(trained)
    run_dir.mkdir(parents=True)
    save_shards(run_dir / "step-00000001.dcp", {"model": state.pop("model")})
    del state["optimizer"]
    path = run_dir / "step-00000001.pt"
    torch.save({**state, "shards": "step-00000001.dcp"}, path)
    return path


@pytest.fixture
def hostile(trained, tmp_path) -> tuple[Path, Path]:
    """(the step-N.pt of a sharded run whose index runs a command, the command's marker)."""
    path = sharded_run(trained, tmp_path / "runs/default")
    marker = tmp_path / "ran"
    poison_index(path.with_suffix(".dcp"), marker)
    return path, marker


def test_a_real_shard_folder_loads_and_consolidates_to_its_weights(trained, tmp_path):
    path = sharded_run(trained, tmp_path / "run")
    assert checkpoint.load(path)["shards"] == str(path.with_suffix(".dcp"))
    full = checkpoint.load(checkpoint.consolidate(path))["model"]
    weights = checkpoint.load(trained)["model"]
    assert full.keys() == weights.keys()
    assert all(torch.equal(full[key], weights[key]) for key in weights)


def test_an_index_of_every_dtype_and_layout_reads_back(tmp_path):
    """The dtypes (and memory formats, layouts) an index names are what the unpickler allows."""
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64]
    dtypes += [torch.int8, torch.uint8, torch.bool, torch.complex64]
    saved = {str(d): torch.arange(120).reshape(2, 3, 4, 5).to(d) for d in dtypes}
    saved["nhwc"] = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    save_shards(tmp_path / "shards", {"model": saved})
    loaded = {"model": {k: torch.zeros_like(v) for k, v in saved.items()}}
    with pytest.warns(UserWarning, match="torch.distributed is "):
        shard_reader.load(loaded, tmp_path / "shards")
    assert all(torch.equal(loaded["model"][k], v) for k, v in saved.items())


@pytest.mark.parametrize(
    "module, name",
    [("torch", "load"), ("torch", "_dynamo"), ("builtins", "eval"), ("os", "system")],
)
def test_any_other_global_in_an_index_is_refused(tmp_path, module, name):
    """Only DCP's index classes, torch.Size, the dtypes and a layout by name are built: a torch
    function, a submodule (its import a side effect) or a builtin is refused by name."""
    (tmp_path / ".metadata").write_bytes(f"c{module}\n{name}\n.".encode())
    with pytest.raises(
        CheckpointError, match=rf"holds pickled Python objects \({module}\.{name}\)"
    ):
        shard_reader.read_index(tmp_path)


def test_an_index_cannot_rewrite_the_classes_or_functions_it_may_name(tmp_path):
    """pickle's BUILD sets state on whatever is below it: a real index with a few bytes put
    in was read as valid, and afterwards every PurePosixPath named the attacker's file; one
    that was refused still poisoned _get_layout's cache. Both gadgets of the review."""
    save_shards(tmp_path / "shards", {"model": {"w": torch.ones(2)}})
    genuine = (tmp_path / "shards/.metadata").read_bytes()
    assert genuine[:2] == b"\x80\x04"  # PROTO 4; what follows is the real index
    target = str(tmp_path / "attacker")
    path_gadget = (  # (PurePosixPath, (None, {"_str": target})) BUILD, then POP
        b"cpathlib\nPurePosixPath\nN}X\x04\x00\x00\x00_str"
        + b"X" + len(target).to_bytes(4, "little") + target.encode()
        + b"s\x86b0"
    )  # fmt: skip
    layout_gadget = (  # _get_layout.__dict__.update({"cache": {"torch.strided": float32}})
        b"ctorch.serialization\n_get_layout\n}(Vcache\n}(Vtorch.strided\nctorch\nfloat32\nuub"
    )
    before = getattr(torch.serialization._get_layout, "cache", None)
    for gadget, refused in [(path_gadget, "PurePosixPath"), (layout_gadget, "_get_layout")]:
        (tmp_path / "shards/.metadata").write_bytes(genuine[:2] + gadget + genuine[2:])
        with pytest.raises(CheckpointError, match=f"\\(state set on \\w+ {refused}\\)"):
            shard_reader.read_index(tmp_path / "shards")
    assert str(Path("a/b")) == "a/b" and str(Path.home() / "x") != target
    assert getattr(torch.serialization._get_layout, "cache", None) == before
    (tmp_path / "shards/.metadata").write_bytes(genuine)
    index = shard_reader.read_index(tmp_path / "shards")  # the genuine one still reads
    assert index.state_dict_metadata["model.w"].properties.layout == torch.strided


def test_a_shard_index_that_holds_code_is_refused_by_load_and_consolidate(hostile, capsys):
    path, marker = hostile
    index = str(path.with_suffix(".dcp") / ".metadata")
    with pytest.raises(CheckpointError, match=REFUSED) as caught:
        checkpoint.load(path)
    assert repr(index) in str(caught.value) and "\n" not in str(caught.value)
    capsys.readouterr()
    assert consolidate_main(["--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "refuses" in err[0], err
    assert not marker.exists() and not path.with_name(f"{path.stem}.full.pt").exists()


def test_resume_auto_and_init_from_refuse_it_and_set_nothing_aside(hostile, tmp_path):
    path, marker = hostile
    before = sorted(p.name for p in path.parent.iterdir())  # the run's lock file aside
    base = [*TINY, f"run.output_dir={tmp_path / 'runs'}"]
    with pytest.raises(CheckpointError, match=REFUSED):
        fit(load_config(None, [*base, "train.resume=auto"]))
    with pytest.raises(CheckpointError, match=REFUSED):
        fit(load_config(None, [*base, "run.name=tuned", f"train.init_from={path}"]))
    assert not marker.exists()
    # Refused, not taken for damage: nothing renamed *.bad, nothing else tried.
    assert sorted(p.name for p in path.parent.iterdir() if p.name != ".lock") == before


def trained_pair(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and AdamW after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1 + seed)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def optimizer_shards(folder: Path, lr) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """trained_pair() saved as a sharded run saves it, with `lr` as the saved learning rate
    (DCP saves the optimizer's plain values as pickled entries)."""
    model, optimizer = trained_pair()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    optimizer_state["param_groups"][0]["lr"] = lr
    save_shards(folder, {"model": model_state, "optimizer": optimizer_state})
    return model, optimizer


def test_a_shard_entry_that_holds_code_is_refused_inside_dcp_load(tmp_path):
    marker = tmp_path / "ran"
    model, optimizer = optimizer_shards(tmp_path / "shards", Command(marker))
    entry = r"\(posix\.system in optimizer\.param_groups\.0\.lr\), which weights_only"
    with pytest.raises(CheckpointError, match=entry) as caught:
        sharded.restore({"shards": str(tmp_path / "shards")}, model, optimizer, "ddp")
    assert repr(str(tmp_path / "shards/__0_0.distcp")) in str(caught.value)
    assert not marker.exists()


def test_an_index_that_holds_code_is_refused_inside_dcp_load(tmp_path):
    """Past the check at checkpoint.load (a file replaced between the two reads): the reader
    that dcp.load is given refuses it too."""
    marker = tmp_path / "ran"
    model, optimizer = optimizer_shards(tmp_path / "shards", 0.1)
    poison_index(tmp_path / "shards", marker)
    with pytest.raises(CheckpointError, match=REFUSED) as caught:
        sharded.restore({"shards": str(tmp_path / "shards")}, model, optimizer, "ddp")
    assert repr(str(tmp_path / "shards/.metadata")) in str(caught.value)
    assert not marker.exists()


def test_real_optimizer_shards_restore_exactly(tmp_path):
    saved_model, saved_optimizer = optimizer_shards(tmp_path / "shards", 0.1)
    model, optimizer = trained_pair(seed=1)  # other weights, moments and lr
    sharded.restore({"shards": str(tmp_path / "shards")}, model, optimizer, "ddp")
    expected = saved_model.state_dict()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    got, want = optimizer.state_dict(), saved_optimizer.state_dict()
    for index, moments in want["state"].items():
        assert all(torch.equal(got["state"][index][k], v) for k, v in moments.items())
    assert got["param_groups"][0]["lr"] == 0.1
