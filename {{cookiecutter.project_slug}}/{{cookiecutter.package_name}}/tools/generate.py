"""predict.py --prompt: a language model trained on a text file (data.name=text) continues a
prompt of characters of its vocabulary, the checkpoint's meta["vocab"]."""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..utils.device import autocast
from .inference import device_option, inference_amp, load_trained


def check_sampling(temperature: float = 1.0, top_k: int = 0) -> None:
    """Refuse sampling options that cannot run, as the config refuses its values."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 picks the likeliest), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0 (0 samples among all), got {top_k}")


def generate(
    checkpoint: str,
    prompt: str,
    tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    device: str = "auto",
    amp: str | None = None,
) -> str:
    """The prompt continued by `tokens` tokens of the checkpoint's language model, under
    `amp` (None: the checkpoint's train.amp)."""
    if tokens < 0:
        raise ConfigError(f"--tokens must be >= 0, got {tokens}")
    check_sampling(temperature, top_k)
    target = device_option(device)
    trained = load_trained(checkpoint)
    vocab = trained.meta.get("vocab") or trained.meta.get("vocabulary")
    if not vocab or not hasattr(trained.model, "generate"):
        raise ConfigError(
            f"checkpoint {checkpoint!r} is not a language model with a vocabulary and "
            "generate(); --prompt needs one (other models take files)"
        )
    index = {token: i for i, token in enumerate(vocab)}
    unknown = next((c for c in prompt if c not in index), None)
    if unknown is not None or not prompt:
        what = f"the character {unknown!r}, which the model's vocabulary lacks" if prompt else ""
        raise ConfigError(
            f"--prompt holds {what or 'nothing'}; use characters of its training text "
            f"({''.join(vocab)[:60]!r})"
        )
    idx = torch.tensor([[index[c] for c in prompt]], device=target)
    with autocast(target, inference_amp(trained, target, amp)):
        out = trained.model.to(target).generate(idx, tokens, temperature=temperature, top_k=top_k)
    return "".join(vocab[i] for i in out[0].tolist())
