"""Seeding and RNG state capture, so runs repeat and resumed runs continue the same streams."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

_MASK64 = 2**64 - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every int of `parts`, e.g. (run seed, epoch) or (run seed,
    rank). Adding them (seed + epoch) would make seed 43's epoch k seed 42's epoch k+1, so runs
    "over seeds" would share data orders; a hash makes nearby tuples unrelated. Each part goes
    through a splitmix64 round (Steele et al. 2014), a bijection of 64-bit words that mixes
    every input bit into every output bit; cheap enough to call once per sample."""
    h = len(parts)
    for part in parts:
        h = (h ^ (part & _MASK64)) * 0x9E3779B97F4A7C15 & _MASK64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h >> 1  # torch.manual_seed and numpy take it; no sign trouble


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all CUDA devices too); optionally deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before the first matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: torch seeds each worker, numpy and random need it too."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """All RNG streams of this process, as plain containers and tensors (weights_only-safe)."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() captured. Tensors may arrive on any device (a checkpoint
    loaded with another map_location): the generators take CPU byte tensors only."""
    random.setstate(_as_tuples(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {
                "key": _cpu(np_state["key"]).numpy().astype(np.uint32),
                "pos": np_state["pos"],
            },
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(_cpu(state["torch"]))
    if state["cuda"] and torch.cuda.is_available():
        cuda = [_cpu(s) for s in state["cuda"]]
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.cpu() if tensor.device.type != "cpu" else tensor


def _as_tuples(value):
    # random.setstate wants tuples; a checkpoint may hand back lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
