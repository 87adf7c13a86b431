"""Hugging Face transformers sequence classifiers, by hub id or save_pretrained folder.

    model:
      name: hf
      arch: prajjwal1/bert-tiny   # a hub id, or a folder save_pretrained wrote
      pretrained: true            # its weights (false: the same config from random init)
      weights: ""                 # a save_pretrained folder to read instead of `arch`

The classification head (`classifier` or `score`) is built for the task's classes, the rest is
loaded. Inputs are token ids (N, T) padded with the tokenizer's pad id, which the attention
mask leaves out; data.name=text_table tokenises with this model's tokenizer (data.tokenizer:
auto). Offline: a folder (save_pretrained's model and tokenizer files) as arch or weights;
HF_HUB_OFFLINE=1 keeps the hub client from retrying. Install: pip install -e '.[hf]'.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..errors import ConfigError, first_line
from .zoo import Options, Zoo, offline, require

HEADS = ("classifier", "score")  # what transformers names a sequence classifier's head


class HFText(Zoo):
    """AutoModelForSequenceClassification for the task's outputs."""

    input_fix = "lower data.max_length to the model's max_position_embeddings"

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        transformers = require("transformers", "hf")
        source = opts.weights or opts.arch
        auto = transformers.AutoModelForSequenceClassification
        try:
            config = transformers.AutoConfig.from_pretrained(source, num_labels=num_outputs)
            if opts.pretrained:
                self.net = auto.from_pretrained(
                    source, config=config, ignore_mismatched_sizes=True
                )
            else:
                self.net = auto.from_config(config)
        except (OSError, ValueError) as exc:
            raise ConfigError(_unreadable(source, exc)) from None
        self.pad_id = self.net.config.pad_token_id
        if self.pad_id is None:  # some (GPT-2) have none: the data pads with the end token
            self.pad_id = self.net.config.pad_token_id = self.net.config.eos_token_id
        head = [
            f"{name}.{k}"
            for name in HEADS
            if hasattr(self.net, name)
            for k in getattr(self.net, name).state_dict()
        ]
        loaded = len(self.net.state_dict()) - len(head)
        self.weights_note = f"hf {source}: random init (model.pretrained=false)"
        if opts.pretrained:
            self.weights_note = f"hf {source}: loaded {loaded} tensors; new: {', '.join(head)}"

    def forward(self, x: Tensor) -> Tensor:
        mask = (x != self.pad_id).long()  # padding (data/text_table.py) is left out
        return self.net(input_ids=x, attention_mask=mask).logits

    def head(self) -> nn.Module:
        return next(getattr(self.net, name) for name in HEADS if hasattr(self.net, name))

    @staticmethod
    def preprocessing(opts: Options) -> dict:
        """The text data's tokenizer: the model's own (its folder or hub id)."""
        require("transformers", "hf")
        return {"tokenizer": opts.weights or opts.arch}


def _unreadable(source: str, exc: BaseException) -> str:
    text = str(exc)
    if "connect" in text.lower() or "offline" in text.lower() or "cache" in text.lower():
        return offline(f"Hugging Face model {source!r}", exc, "a save_pretrained folder")
    return (
        f"model.arch={source!r} is not a Hugging Face model this machine can read "
        f"({first_line(exc, 120)}); give a hub id or a folder save_pretrained wrote"
    )
