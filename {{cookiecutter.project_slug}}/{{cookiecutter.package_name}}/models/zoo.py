"""Pretrained image models from the zoos, by name: torchvision's and timm's architectures.

    model:
      name: timm              # or torchvision
      arch: resnet18          # the library's model name
      pretrained: true        # its weights (false: the same architecture from random init)
      weights: ""             # "" = the library's download and cache; or a local file

The classifier is built for the task's outputs (classes, targets, labels) and is the model's
head (finetune.py): it is the one part not loaded. timm adapts the first convolution to the
data's channels; torchvision models take 3. The weights' own preprocessing (input size, crop,
interpolation, mean and std) becomes the image data's where data.image_size, crop_pct,
interpolation, mean and std are left at auto (data/image_folder.py), and travels in the
checkpoint to the tools that read it (evaluation, prediction).

Offline (a cluster without the network): give `weights:` a file. torchvision reads a state
dict (.pth/.pt/.safetensors, as its URL serves it); timm the file its hub serves
(pytorch_model.bin, model.safetensors). Or fill the libraries' caches on a machine that has the
network: $TORCH_HOME/hub/checkpoints/ (torchvision), $HF_HOME/hub (timm), then copy them over.
The libraries are extras: pip install -e '.[vision]' (timm needs torchvision too).
"""

from __future__ import annotations

import importlib
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config.text import did_you_mean
from ..errors import ConfigError, first_line

CLASSIFIER_NAMES = ("fc", "classifier", "heads", "head")  # torchvision's, by architecture


@dataclass
class Options:
    arch: str = "resnet18"  # the library's architecture name (its list_models())
    pretrained: bool = True  # start from the library's weights; false: random init
    weights: str = ""  # a local weights file; "" = the library's download and cache

    def checks(self):
        return [("arch", bool(self.arch.strip()), "an architecture name, e.g. resnet18")]


def require(module: str, extra: str = "vision"):
    """An optional zoo library, or one line naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        name = "hf" if extra == "hf" else module
        pair = " (torchvision must match torch's version: scripts/doctor.py checks the pair)"
        raise ConfigError(
            f"model.name={name} needs {module}, which does not import here "
            f"({first_line(exc, 80)}); pip install -e '.[{extra}]'"
            + (pair if extra == "vision" else "")
        ) from None


def check_arch(library: str, arch: str, names: list[str]) -> None:
    if arch not in names:
        raise ConfigError(
            f"model.arch={arch!r} is not a {library} architecture{did_you_mean(arch, names)}; see "
            f"{library}'s list_models() for the {len(names)} it has"
        )


def read_weights(path: str) -> dict:
    """A state dict from a local file: .safetensors, or a torch file read with weights_only
    (tensors and plain containers only: a file carrying pickled code is refused)."""
    from ..checkpoint import files
    from ..checkpoint.state import refuse_nonfinite

    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"model.weights={path!r} not found; give a weights file, or '' for "
            "the library's download and cache"
        )
    if file.suffix == ".safetensors":
        try:
            state = importlib.import_module("safetensors.torch").load_file(str(file))
        except Exception as exc:  # SafetensorError (a damaged header or body), OSError
            raise ConfigError(
                f"model.weights={path!r} cannot be read as safetensors ({first_line(exc, 80)}); "
                "the file is damaged or not safetensors: download or save it again"
            ) from None
    else:
        state = files.load(file)
    state = (
        state.get("model", state.get("state_dict", state)) if isinstance(state, dict) else state
    )
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ConfigError(f"model.weights={path!r} is not a state dict (names to tensors)")
    refuse_nonfinite(state, f"model.weights={path!r}")
    return state


def load_matching(net: nn.Module, state: dict, head: set[str], source: str) -> str:
    """Load `state` into `net` but its `head` tensors (built for this task); refuse a file of
    another architecture, naming the first tensor that does not fit. Returns the report."""
    own = net.state_dict()
    for name, tensor in own.items():
        if name in head:
            continue
        theirs = state.get(name)
        if theirs is None or theirs.shape != tensor.shape:
            found = "missing" if theirs is None else f"shape {tuple(theirs.shape)}"
            raise ConfigError(
                f"{source} does not fit model.arch: tensor {name!r} is {found}, the model's is "
                f"{tuple(tensor.shape)}; give the weights of this architecture"
            )
    kept = {k: v for k, v in state.items() if k in own and k not in head}
    net.load_state_dict(kept, strict=False)
    return f"loaded {len(kept)} tensors from {source}; new: {', '.join(sorted(head))}"


class Zoo(nn.Module):
    """What the zoo models share: the library's network as `net`, its classifier as head()."""

    Options = Options
    net: nn.Module
    input_fix = "set data.image_size=0 (auto: the size its weights were trained at)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Torchvision(Zoo):
    """A torchvision classification model (torchvision.models.list_models())."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        models = require("torchvision").models
        check_arch("torchvision", opts.arch, models.list_models(module=models))
        if input_shape[0] != 3:
            raise ConfigError(
                f"model.name=torchvision takes 3-channel images, the data gives "
                f"{input_shape[0]}; use model.name=timm, which adapts the first convolution"
            )
        self.net = models.get_model(opts.arch, weights=None, num_classes=num_outputs)
        self.weights_note = f"torchvision {opts.arch}: random init (model.pretrained=false)"
        if opts.pretrained:
            state, source = self._pretrained(models, opts)
            head = {f"{self._head_name()}.{k}" for k in self.head().state_dict()}
            self.weights_note = f"torchvision {opts.arch}: " + load_matching(
                self.net, state, _mismatched(self.net, state) & head, source
            )

    def _head_name(self) -> str:
        return next(name for name in CLASSIFIER_NAMES if hasattr(self.net, name))

    def head(self) -> nn.Module:
        return getattr(self.net, self._head_name())

    @staticmethod
    def _pretrained(models, opts: Options) -> tuple[dict, str]:
        if opts.weights:
            return read_weights(opts.weights), opts.weights
        weights = models.get_model_weights(opts.arch).DEFAULT
        try:  # from $TORCH_HOME/hub/checkpoints/ when there, else downloaded into it
            # weights_only: hub's default unpickles anything, and a cache is often copied in
            state = weights.get_state_dict(progress=False, check_hash=False, weights_only=True)
            return state, weights.url
        except pickle.UnpicklingError:
            raise ConfigError(
                f"torchvision's {opts.arch} weights in the hub cache ($TORCH_HOME/hub/"
                "checkpoints) hold pickled Python objects, which weights_only loading refuses "
                "(they can run code); delete that file, or give model.weights a file you trust"
            ) from None
        except OSError as exc:
            raise ConfigError(offline(f"torchvision's {opts.arch} weights", exc)) from None

    @staticmethod
    def preprocessing(opts: Options) -> dict:
        models = require("torchvision").models
        check_arch("torchvision", opts.arch, models.list_models(module=models))
        t = models.get_model_weights(opts.arch).DEFAULT.transforms()
        return {
            "image_size": t.crop_size[0],
            "crop_pct": t.crop_size[0] / t.resize_size[0],
            "interpolation": t.interpolation.value,
            "mean": list(t.mean),
            "std": list(t.std),
        }


class Timm(Zoo):
    """A timm model (timm.list_models()); timm loads its weights, drops a classifier of another
    size and adapts the first convolution to the data's channels."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        timm = require("timm")
        check_arch("timm", opts.arch, timm.list_models())
        local = opts.pretrained and opts.weights  # a rebuilt model (architecture()) reads none
        overlay = {"file": str(Path(opts.weights).resolve())} if local else None
        state = read_weights(opts.weights) if local else None  # one line: missing, code, ...
        build = dict(num_classes=num_outputs, in_chans=input_shape[0])
        try:
            self.net = timm.create_model(
                opts.arch, pretrained=opts.pretrained, pretrained_cfg_overlay=overlay, **build
            )
        except RuntimeError as exc:  # a file of another architecture (load_state_dict)
            if not local:
                raise ConfigError(offline(f"timm's {opts.arch} weights", exc)) from None
            net = timm.create_model(opts.arch, pretrained=False, **build)
            load_matching(net, state, self._head_of(net), opts.weights)
            raise  # load_matching names the misfit; anything else is timm's own error
        except OSError as exc:
            raise ConfigError(offline(f"timm's {opts.arch} weights", exc)) from None
        head = self._head_of(self.net)
        loaded = len(self.net.state_dict()) - len(head)
        if local:  # timm loads non-strictly where the head's size differs: check it here
            loaded = _strict_but_head(self.net.state_dict(), state, head, opts.weights)
        source = opts.weights or "timm's hub cache"
        self.weights_note = f"timm {opts.arch}: random init (model.pretrained=false)"
        if opts.pretrained:
            new = ", ".join(sorted(head))
            self.weights_note = (
                f"timm {opts.arch}: loaded {loaded} tensors from {source}; new: {new}"
            )

    @staticmethod
    def _head_of(net: nn.Module) -> set[str]:
        name = net.pretrained_cfg.get("classifier", "fc")
        return {k for k in net.state_dict() if k.startswith(f"{name}.")}

    def head(self) -> nn.Module:
        return self.net.get_classifier()

    @staticmethod
    def preprocessing(opts: Options) -> dict:
        timm = require("timm")
        check_arch("timm", opts.arch, timm.list_models())
        cfg = timm.get_pretrained_cfg(opts.arch)
        return {
            "image_size": cfg.input_size[-1],
            "crop_pct": cfg.crop_pct,
            "interpolation": cfg.interpolation or "bilinear",
            "mean": list(cfg.mean),
            "std": list(cfg.std),
        }


def _strict_but_head(own: dict, state: dict, head: set[str], source: str) -> int:
    """How many of the model's tensors came from `state`; refuses, naming the first, a
    tensor of the model (but its head and BatchNorm's step counters) that `state` lacks, or
    one of `state` that the model lacks: timm loads a file non-strictly when it drops the
    classifier, so a file missing a backbone tensor would train it from random init."""
    counters = ".num_batches_tracked"
    missing = [k for k in own if k not in head and k not in state and not k.endswith(counters)]
    extra = [k for k in state if k not in own and k not in head]
    if missing or extra:
        which, name = ("is missing", missing[0]) if missing else ("is not in the model", extra[0])
        raise ConfigError(
            f"model.weights={source!r} does not fit model.arch: tensor {name!r} {which} "
            f"({len(missing)} missing, {len(extra)} unexpected); give the weights of this "
            "architecture"
        )
    return sum(1 for k in own if k not in head and k in state)


def _mismatched(net: nn.Module, state: dict) -> set[str]:
    """The model's tensors that `state` lacks or has in another shape."""
    return {k for k, v in net.state_dict().items() if k not in state or state[k].shape != v.shape}


def offline(what: str, exc: BaseException, local: str = "a local weights file") -> str:
    return (
        f"{what} could not be read ({first_line(exc, 100)}); without the network, set "
        f"model.weights=<{local}>, and HF_HUB_OFFLINE=1 to stop the hub's retries "
        "(docs/data.md: Pretrained models)"
    )
