"""Fine-tuning controls (finetune.py): a frozen backbone stays bitwise the same and moves once
unfrozen, its BatchNorm statistics stay put while frozen, the backbone's lr is a ratio of the
head's at every step, and a run stopped before or after the unfreeze resumes exactly."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import stop_after, tiny_with
from test_distributed import (
    DUMP_RANKS,
    EXACT,
    STANDALONE,
    assert_close,
    assert_same,
    ranks,
    torchrun,
)

from {{ cookiecutter.package_name }} import checkpoint, finetune, models, trainer
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.cnn import Options, SmallCNN
from {{ cookiecutter.package_name }}.optim import build_optimizer, build_scheduler, continue_schedule
from {{ cookiecutter.package_name }}.trainer import fit

STEPS_PER_EPOCH = 256 // 16  # conftest.TINY


@pytest.fixture(scope="module")
def dump_ranks(tmp_path_factory):
    """scripts/train.py that saves each rank's final weights (test_distributed.py's)."""
    path = tmp_path_factory.mktemp("helper") / "dump_ranks.py"
    path.write_text(DUMP_RANKS)
    return path


@pytest.fixture
def initial(monkeypatch) -> dict:
    """The model's weights and buffers when training starts (after any init, before a step)."""
    seen = {}
    distribute = trainer.distribute

    def recording(cfg, dist, device, trainee, epoch):
        seen.update({k: v.clone() for k, v in trainee.model.state_dict().items()})
        return distribute(cfg, dist, device, trainee, epoch)

    monkeypatch.setattr(trainer, "distribute", recording)
    return seen


def parts(state: dict) -> tuple[dict, dict]:
    """(head, backbone) entries of a SmallCNN state dict."""
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    return head, {k: v for k, v in state.items() if not k.startswith("head.")}


def same(a: dict, b: dict) -> list[str]:
    return [k for k in a if torch.equal(a[k], b[k])]


def test_a_frozen_backbone_and_its_batchnorm_stay_bitwise_while_the_head_trains(tiny, initial):
    result = fit(load_config(None, [*tiny, "train.epochs=1", "train.freeze_epochs=1"]))
    head, backbone = parts(result["model"].state_dict())
    head0, backbone0 = parts(initial)
    assert same(backbone, backbone0) == list(backbone)  # weights and BN running statistics
    assert not same(head, head0)


def test_the_backbone_moves_once_unfrozen_and_its_batchnorm_learns_again(tiny, initial):
    result = fit(load_config(None, [*tiny, "train.epochs=2", "train.freeze_epochs=1"]))
    _, backbone = parts(result["model"].state_dict())
    _, backbone0 = parts(initial)
    moved = [k for k in backbone if not torch.equal(backbone[k], backbone0[k])]
    assert "features.0.layers.0.weight" in moved
    assert "features.0.layers.1.running_mean" in moved


def test_bn_frozen_always_keeps_the_backbone_statistics_while_its_weights_train(tiny, initial):
    args = [*tiny, "train.epochs=1", "train.bn_frozen=always"]
    _, backbone = parts(fit(load_config(None, args))["model"].state_dict())
    _, backbone0 = parts(initial)
    stats = [k for k in backbone if "running_" in k]
    assert stats and same({k: backbone[k] for k in stats}, backbone0) == stats
    assert not torch.equal(
        backbone["features.0.layers.0.weight"], backbone0["features.0.layers.0.weight"]
    )


def test_the_backbone_lr_is_its_ratio_of_the_head_lr_at_every_step_and_after_a_change():
    cfg = load_config(None, ["train.backbone_lr_ratio=0.1", "train.warmup_steps=3"]).train
    model = SmallCNN((3, 8, 8), 4, Options(width=4, depth=1))
    optimizer = build_optimizer(model, cfg, 0.01, fused=False)
    scheduler = build_scheduler(optimizer, cfg, 20)
    head, backbone = finetune.split(model)
    assert {id(p) for g in optimizer.param_groups if g["part"] == "head" for p in g["params"]} == {
        id(p) for p in head
    }
    for _ in range(6):
        lrs = {g["part"]: g["lr"] for g in optimizer.param_groups}
        assert lrs["backbone"] == pytest.approx(0.1 * lrs["head"], rel=1e-12)
        optimizer.step()
        scheduler.step()
    changed = load_config(None, ["train.backbone_lr_ratio=0.5", "train.warmup_steps=3"]).train
    continue_schedule(optimizer, scheduler, changed, 0.01, 20)
    lrs = {g["part"]: g["lr"] for g in optimizer.param_groups}
    assert lrs["backbone"] == pytest.approx(0.5 * lrs["head"], rel=1e-12)
    scheduler.step()
    assert scheduler.get_last_lr()[2] == pytest.approx(0.5 * scheduler.get_last_lr()[0])


@pytest.mark.slow
@pytest.mark.parametrize("stop_step", [STEPS_PER_EPOCH - 6, STEPS_PER_EPOCH + 5])
def test_a_run_stopped_before_or_after_the_unfreeze_resumes_bitwise(
    tiny, tmp_path, monkeypatch, stop_step
):
    """Stopped mid-epoch while frozen (the resumed run unfreezes on its own) and after the
    unfreeze (the backbone's AdamW moments are in the checkpoint)."""
    args = [*tiny, "train.freeze_epochs=1", "train.backbone_lr_ratio=0.3", "run.log_every=1"]
    straight = fit(load_config(None, [*args, f"run.output_dir={tmp_path / 'a'}"]))
    stop_after(monkeypatch, stop_step)
    out = f"run.output_dir={tmp_path / 'b'}"
    assert fit(load_config(None, [*args, out]))["stopped"] == "SIGTERM"
    monkeypatch.undo()
    resumed = fit(load_config(None, [*args, out, "train.resume=auto"]))
    a, b = straight["model"].state_dict(), resumed["model"].state_dict()
    assert same(a, b) == list(a)


class Headless(torch.nn.Sequential):
    """A model whose layers are only numbered: no head to tell from a backbone."""

    def __init__(self, input_shape, num_outputs, opts):
        super().__init__(torch.nn.Flatten(), torch.nn.Linear(math.prod(input_shape), num_outputs))


def test_a_model_without_a_head_is_refused_in_one_line_before_anything_is_written(
    tiny, tmp_path, monkeypatch
):
    monkeypatch.setitem(models.MODELS, "headless", Headless)
    args = [*tiny_with(tiny, "model.name=headless"), "train.freeze_epochs=1"]
    with pytest.raises(ConfigError, match="model.name=headless names no head apart from its"):
        fit(load_config(None, args))
    assert not (tmp_path / "runs").exists()
    fit(load_config(None, args[:-1]))  # without fine-tuning controls it trains


def test_a_resume_cannot_turn_the_head_and_backbone_split_on(tiny):
    fit(load_config(None, [*tiny, "train.max_steps=3"]))
    with pytest.raises(ConfigError, match="start a new run from its weights"):
        fit(load_config(None, [*tiny, "train.resume=auto", "train.backbone_lr_ratio=0.1"]))


@pytest.mark.parametrize(
    "override, rule",
    [("train.freeze_epochs=-2", "or -1"), ("train.backbone_lr_ratio=0", r"in \(0, 10\]")],
)
def test_fine_tuning_values_out_of_range_are_refused(override, rule):
    with pytest.raises(ConfigError, match=rule):
        load_config(None, [override])


def test_checkpoint_keeps_the_fine_tuning_settings(tiny, tmp_path):
    fit(load_config(None, [*tiny, "train.epochs=1", "train.freeze_epochs=1"]))
    state = checkpoint.load(tmp_path / "runs/default/last.pt")
    assert state["config"]["train"]["freeze_epochs"] == 1
    assert [g["part"] for g in state["optimizer"]["param_groups"]] == ["head"] * 2 + [
        "backbone"
    ] * 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # feature: fsdp
@pytest.mark.parametrize("strategy", ["ddp"])  # feature: !fsdp
def test_two_ranks_freeze_and_unfreeze_in_step_with_one_process(tmp_path, dump_ranks, strategy):
    """ddp syncs only the parameters it was built with: the unfreeze rebuilds it, or the
    ranks' backbones would drift apart. fsdp shards frozen and trainable parameters alike."""  # feature: fsdp
    ranks' backbones would drift apart."""  # feature: !fsdp
    args = [*EXACT, "train.freeze_epochs=1", "train.backbone_lr_ratio=0.5"]
    one = fit(
        load_config(None, [*args, "train.batch_size=32", f"run.output_dir={tmp_path / 'one'}"])
    )
    two = [
        *args,
        "train.batch_size=16",
        f"train.strategy={strategy}",
        f"run.output_dir={tmp_path / 'runs'}",
    ]
    torchrun(STANDALONE, dump_ranks, tmp_path, *two)
    last = tmp_path / "runs/default/last.pt"
    # >>> fsdp
    if strategy == "fsdp":  # each rank holds shards: compare the consolidated checkpoint
        last = checkpoint.consolidate(last)
    else:
        rank0, rank1 = ranks(tmp_path)
        assert_same(rank0["model"], rank1["model"])
    # <<< fsdp
    # >>> !fsdp
    rank0, rank1 = ranks(tmp_path)
    assert_same(rank0["model"], rank1["model"])
    # <<< !fsdp
    assert_close(checkpoint.load(last)["model"], one["model"].state_dict())


def test_no_parameter_group_is_empty():
    """A head of one weight without a bias (as one tied to an input embedding is) left
    an empty no-decay group, whose settings torch.distributed.checkpoint drops: a sharded
    run's resume then failed with KeyError: 'betas'."""

    class TiedHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 4, bias=False)

    cfg = load_config(None, ["train.backbone_lr_ratio=0.5"]).train
    groups = finetune.param_groups(TiedHead(), cfg, "tied")
    assert all(group["params"] for group in groups)
    kept = [(g["part"], g["decay"]) for g in groups]
    assert kept == [("head", True), ("backbone", True), ("backbone", False)]
