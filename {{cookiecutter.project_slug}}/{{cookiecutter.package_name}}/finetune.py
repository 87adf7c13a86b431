"""Fine-tuning controls: a model's head (new, trained from the first step) and its backbone
(pretrained: frozen for train.freeze_epochs, then trained at train.backbone_lr_ratio x the
head's learning rate), and BatchNorm statistics kept while the backbone is frozen.

A model names its head with a method `head()` returning the module(s) its task output comes
from (the pretrained models, the cnn and the mlp do); otherwise a child module called
`head`, `classifier` or `fc` is taken. Everything else is the backbone.

Every choice here is a function of the settings and the epoch, never of the run's history,
so a resumed run freezes, unfreezes and sets BatchNorm exactly as the run it continues.
"""

from __future__ import annotations

from torch import nn

from .config import TrainConfig
from .errors import ConfigError

HEAD_NAMES = ("head", "classifier", "fc")


def used(cfg: TrainConfig) -> bool:
    """Whether the run treats head and backbone apart at all."""
    return cfg.freeze_epochs != 0 or cfg.backbone_lr_ratio != 1.0 or cfg.bn_frozen == "always"


def head_modules(model: nn.Module) -> list[nn.Module]:
    declared = getattr(model, "head", None)
    if callable(declared) and not isinstance(declared, nn.Module):
        found = declared()
        return list(found) if isinstance(found, (list, tuple)) else [found]
    for name in HEAD_NAMES:
        module = getattr(model, name, None)
        if isinstance(module, nn.Module):
            return [module]
    return []


def split(model: nn.Module, model_name: str = "this model") -> tuple[list, list]:
    """(head parameters, backbone parameters) of `model`, each in the model's order."""
    head = {id(p) for module in head_modules(model) for p in module.parameters()}
    params = list(model.parameters())
    if not head or len(head) == len(params):
        raise ConfigError(
            f"model.name={model_name} names no head apart from its backbone, which "
            "train.freeze_epochs, train.backbone_lr_ratio and train.bn_frozen need; give the "
            "model a head() method returning its output layer (docs/extending.md)"
        )
    return [p for p in params if id(p) in head], [p for p in params if id(p) not in head]


def frozen(cfg: TrainConfig, epoch: int) -> bool:
    """Whether the backbone is frozen during `epoch` (counted from 0): the first
    train.freeze_epochs epochs, or all of them when it is -1 (a linear probe)."""
    return cfg.freeze_epochs == -1 or epoch < cfg.freeze_epochs


def set_epoch(model: nn.Module, cfg: TrainConfig, epoch: int, model_name: str) -> bool:
    """Freeze or unfreeze the backbone for `epoch`. Frozen parameters take no gradient (no
    backward through them, no optimizer step: they stay bitwise the same). Returns whether
    requires_grad changed, which ddp and torch.compile must be rebuilt for."""
    if not used(cfg):
        return False
    _, backbone = split(model, model_name)
    want = not frozen(cfg, epoch)
    changed = any(p.requires_grad != want for p in backbone)
    for p in backbone:
        p.requires_grad_(want)
    return changed


def train_mode(net: nn.Module, model: nn.Module, cfg: TrainConfig, epoch: int) -> None:
    """`net` (the model, maybe wrapped) in training mode; but the backbone's BatchNorm layers
    keep their running statistics (eval mode) while it is frozen, or always with
    train.bn_frozen=always. A frozen backbone fed batches of another dataset would otherwise
    drift its statistics away from its weights."""
    net.train()
    if not used(cfg) or not (cfg.bn_frozen == "always" or frozen(cfg, epoch)):
        return
    head = {id(m) for h in head_modules(model) for m in h.modules()}
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and id(module) not in head:
            module.eval()


def param_groups(model: nn.Module, cfg: TrainConfig, model_name: str) -> list[dict]:
    """AdamW's parameter groups: decayed (2-D and up) and not (biases, norm weights), for the
    head and, at train.backbone_lr_ratio of its lr, the backbone. Each group carries its
    `lr_ratio`, which the schedule multiplies the peak lr by (optim.py), and its `part`."""
    if used(cfg):
        head, backbone = split(model, model_name)
        parts = [("head", head, 1.0), ("backbone", backbone, cfg.backbone_lr_ratio)]
    else:
        parts = [("all", [p for p in model.parameters() if p.requires_grad], 1.0)]
    groups = []
    for part, params, ratio in parts:
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if not chosen:  # a head of one weight, no bias (tied): torch's distributed
                continue  # checkpoint drops an empty group's settings, and a resume failed
            wd = cfg.weight_decay if decay else 0.0
            group = {"params": chosen, "weight_decay": wd, "decay": decay, "part": part}
            groups.append({**group, "lr_ratio": ratio})
    return groups
