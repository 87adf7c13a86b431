# >>> text
"""Hugging Face transformers classifiers of text (model.name=hf) and images (hf_image), by
hub id or save_pretrained folder.

    model:
      name: hf
      arch: prajjwal1/bert-tiny   # a hub id, or a folder save_pretrained wrote
# <<< text
# >>> !text
"""Hugging Face transformers classifiers of images (model.name=hf_image), by hub id or
save_pretrained folder.

    model:
      name: hf_image
      arch: google/vit-base-patch16-224  # a hub id, or a folder save_pretrained wrote
# <<< !text
      pretrained: true            # its weights (false: the same config from random init)
      weights: ""                 # a save_pretrained folder to read instead of `arch`

The classification head (`classifier` or `score`) is built for the task's classes, the rest is
# >>> text
loaded. Inputs are token ids (N, T) padded with the tokenizer's pad id, which the attention
mask leaves out; data.name=text_table tokenises with this model's tokenizer (data.tokenizer:
auto). model.name=hf_image takes images (data.name=image_folder) read as its image processor
says (size, crop, resampling, mean and std: the data's auto). Offline: a folder
(save_pretrained's model and tokenizer or image processor files) as arch or weights;
# <<< text
# >>> !text
loaded. It takes images (data.name=image_folder) read as its image processor says (size,
crop, resampling, mean and std: the data's auto). Offline: a folder (save_pretrained's model
and image processor files) as arch or weights;
# <<< !text
HF_HUB_OFFLINE=1 keeps the hub client from retrying. The tools that read a checkpoint
rebuild the architecture from its config.json (the folder, or the hub's cache): the weights and
the preprocessing come from the checkpoint. Install: pip install -e '.[hf]'.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path  # feature: text

from torch import Tensor, nn

from ..errors import ConfigError, first_line
from .zoo import Options, Zoo, offline, require

HEADS = ("classifier", "score")  # what transformers names a classifier's head
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's codes, in image processors


def load(auto: str, opts: Options, num_outputs: int) -> tuple[nn.Module, str]:
    """transformers' `auto` class (AutoModelFor...) from opts' hub id or folder, its head sized
    for `num_outputs` (the rest loaded, or random with pretrained=false); and the note."""
    transformers = require("transformers", "hf")
    source = opts.weights or opts.arch
    try:
        config = transformers.AutoConfig.from_pretrained(source)
        config.num_labels = num_outputs  # new label maps too: not the weights' own classes
        make = getattr(transformers, auto)
        if opts.pretrained:
            net = make.from_pretrained(source, config=config, ignore_mismatched_sizes=True)
        else:
            net = make.from_config(config)
    except pickle.UnpicklingError:  # a pytorch_model.bin holding code: weights_only refused it
        raise ConfigError(
            f"the weights in {source!r} hold pickled Python objects, which weights_only loading "
            "refuses (they can run code); use its model.safetensors, or re-save it with "
            "save_pretrained if you trust its source"
        ) from None
    except (OSError, ValueError, *_safetensors_error()) as exc:  # damaged files: ValueError
        raise ConfigError(_unreadable(source, exc)) from None
    head = [f"{n}.{k}" for n in HEADS if hasattr(net, n) for k in getattr(net, n).state_dict()]
    note = f"hf {source}: random init (model.pretrained=false)"
    if opts.pretrained:
        loaded = len(net.state_dict()) - len(head)
        note = f"hf {source}: loaded {loaded} tensors; new: {', '.join(head)}"
    return net, note


class HF(Zoo):
    def head(self) -> nn.Module:
        return next(getattr(self.net, name) for name in HEADS if hasattr(self.net, name))


# >>> text
class HFText(HF):
    """AutoModelForSequenceClassification for the task's outputs, on token ids."""

    input_fix = "lower data.max_length to the model's max_position_embeddings"

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        self.net, self.weights_note = load("AutoModelForSequenceClassification", opts, num_outputs)
        self.pad_id = self.net.config.pad_token_id
        if self.pad_id is None:  # some (GPT-2) have none: the data pads with the end token
            self.pad_id = self.net.config.pad_token_id = self.net.config.eos_token_id

    def forward(self, x: Tensor) -> Tensor:
        mask = (x != self.pad_id).long()  # padding (data/text_table.py) is left out
        return self.net(input_ids=x, attention_mask=mask).logits

    @staticmethod
    def preprocessing(opts: Options) -> dict:
        """The text data's tokenizer: the model's own (its folder or hub id)."""
        require("transformers", "hf")
        if opts.weights and Path(opts.weights).is_file():  # a .pth: its tokenizer is not there
            raise ConfigError(
                f"model.weights={opts.weights!r} is a file; model.name=hf reads a folder that "
                "save_pretrained wrote (config.json, the weights and the tokenizer files)"
            )
        return {"tokenizer": opts.weights or opts.arch}
# <<< text


class HFImage(HF):
    """AutoModelForImageClassification (ViT, ConvNeXt, ResNet, ...) on images (N, C, H, W)."""

    input_fix = "set data.image_size=0 (auto: the size its image processor gives)"

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        self.net, self.weights_note = load("AutoModelForImageClassification", opts, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(pixel_values=x).logits

    @staticmethod
    def preprocessing(opts: Options) -> dict:
        """The image processor's size, centre crop, resampling, mean and std."""
        transformers = require("transformers", "hf")
        source = opts.weights or opts.arch
        try:
            proc = transformers.AutoImageProcessor.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise ConfigError(_unreadable(source, exc)) from None
        size = dict(proc.size)
        resized = size.get("shortest_edge") or size.get("height")
        crop = dict(getattr(proc, "crop_size", None) or {})
        if getattr(proc, "do_center_crop", False) and crop.get("height"):
            image_size, crop_pct = crop["height"], crop["height"] / resized
        elif getattr(proc, "crop_pct", None) and size.get("shortest_edge"):
            image_size, crop_pct = resized, proc.crop_pct  # ConvNeXt's
        else:
            image_size, crop_pct = resized, 0.0  # the whole image, squashed to the square
        return {
            "image_size": image_size,
            "crop_pct": crop_pct,
            "interpolation": RESAMPLE.get(int(proc.resample), "bilinear"),
            "mean": list(proc.image_mean),
            "std": list(proc.image_std),
        }


def _safetensors_error() -> tuple:
    """safetensors' SafetensorError (a damaged header or body), where safetensors is there."""
    try:
        return (importlib.import_module("safetensors").SafetensorError,)
    except (ImportError, AttributeError):
        return ()


def _unreadable(source: str, exc: BaseException) -> str:
    text = str(exc)
    if "connect" in text.lower() or "offline" in text.lower() or "cache" in text.lower():
        return offline(f"Hugging Face model {source!r}", exc, "a save_pretrained folder")
    return (
        f"model.arch={source!r} is not a Hugging Face model this machine can read "
        f"({first_line(exc, 120)}); give a hub id or a folder save_pretrained wrote"
    )
