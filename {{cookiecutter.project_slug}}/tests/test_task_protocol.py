"""The task protocol (tasks/protocol.py): every registered task, a user's included, passes
the check on a real batch of data of its kind; a task that breaks the protocol stops a run
before anything is written, with one line naming the method and what it returned."""

from __future__ import annotations

import json  # feature: export

import pytest
import torch
from conftest import tiny_with
from test_extending import readme_file

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.tasks import TASKS, check_task
from {{ cookiecutter.package_name }}.tasks.classification import Classification
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.trainer import build_data, fit


def data_for(targets: str, tmp_path) -> list[str]:
    """Config overrides for small data of each kind of targets a task can ask for."""
    if targets == "tokens":  # feature: text
        (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 40, encoding="utf-8")  # feature: text
        data = ["data.name=text", f"data.path={tmp_path / 'text.txt'}", "data.seq_len=8"]  # feature: text
        return [*data, "model.name=transformer", "model.width=16"]  # feature: text
    if targets == "class":
        return []  # the synthetic images of `tiny`
    x = torch.randn(64, 5)
    y = (x[:, :3] > 0).float() if targets == "labels" else x[:, :2].sum(1, keepdim=True)
    torch.save({"x": x[:48], "y": y[:48]}, tmp_path / "train.pt")
    torch.save({"x": x[48:], "y": y[48:]}, tmp_path / "val.pt")
    return ["data.name=tensors", f"data.root={tmp_path}", "model.name=mlp"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_registered_task_keeps_the_protocol_on_a_real_batch(name, tmp_path, tiny):
    """A task added to TASKS is checked here as it is, on data of the kind it declares."""
    cfg = load_config(None, tiny_with(tiny, f"task.name={name}",
                                      *data_for(TASKS[name].targets, tmp_path)))  # fmt: skip
    train, _, _, task = build_data(cfg)
    x, y = (torch.stack(t) for t in zip(*(train[i] for i in range(4)), strict=True))
    model = build_model(cfg.model, x, task.num_outputs)
    check_task(task, model, x, y)  # raises ConfigError on a broken protocol


def broken(method: str, value):
    """A classifier whose `method` returns `value` (or value(*args)) instead."""

    class Broken(Classification):
        pass

    setattr(Broken, method, lambda self, *args: value(*args) if callable(value) else value)
    return Broken


@pytest.mark.parametrize(
    "method, value, message",
    [
        ("loss", lambda o, y: o.sum(1), r"loss\(output, y\) returned a float32 tensor of sh"),
        ("decode", [1, 2], r"decode\(output\) returned list"),
        ("sums", lambda o, y: {"loss": [1.0], "count": 1}, r"sums\(output, y\)\['loss'\]"),
        ("summarise", lambda s: {"loss": 1.0, "acc": {"a": 1}}, r"summarise\(sums\)\['acc'\]"),
        ("summarise", lambda s: {"loss": 1.0, "count": 2}, r"summarise\(sums\) returned no 'acc'"),
        ("summarise", lambda s: [1.0], r"summarise\(sums\) returned list"),
        ("rows", lambda d: [["cat"]], r"rows\(decoded\) returned list"),
    ],
)
def test_a_task_that_breaks_the_protocol_is_one_line_before_anything_is_written(
    method, value, message, tmp_path, tiny, monkeypatch
):
    monkeypatch.setitem(TASKS, "classification", broken(method, value))
    with pytest.raises(ConfigError, match=f"task Broken: {message}"):
        fit(load_config(None, tiny))
    assert not (tmp_path / "runs").exists()


def test_the_check_changes_nothing_it_is_given(tiny):
    """It tries a copy: a tuned threshold stays unset, the model keeps its mode and state."""
    cfg = load_config(None, [*tiny, "data.num_classes=2", "task.threshold=auto"])
    train, _, meta, task = build_data(cfg)
    x, y = (torch.stack(t) for t in zip(*(train[i] for i in range(8)), strict=True))
    model = build_model(cfg.model, x, task.num_outputs).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_task(task, model, x, y)
    assert "tuned" not in meta and task.threshold == 0.5 and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_readme_s_new_task_keeps_the_protocol_and_trains(tmp_path, tiny, monkeypatch):
    """docs/extending.md's "Adding a task", as written there: one file and one registry line."""
    l1 = readme_file("tasks/l1.py", monkeypatch)
    monkeypatch.setitem(TASKS, "l1", l1.L1)
    args = tiny_with(tiny, "task.name=l1", *data_for("value", tmp_path), "train.epochs=3")
    test_every_registered_task_keeps_the_protocol_on_a_real_batch("l1", tmp_path, tiny)
    result = fit(load_config(None, args))
    assert result["metrics"]["mae"] == result["metrics"]["loss"] > 0
    best = tmp_path / "runs" / "default" / "best.pt"
    assert best.is_file()
    # >>> export
    # Without head() and describe(), the artifact applies the task's decode and says so.
    assert export_main(["--checkpoint", str(best), "--format", "torchscript"]) == 0
    exported = json.loads(best.with_name("best.torchscript.pt.json").read_text())
    assert exported["output"]["units"].startswith("task.name=l1's outputs as its decode()")
    assert exported["parity"]["passed"]
    # <<< export
