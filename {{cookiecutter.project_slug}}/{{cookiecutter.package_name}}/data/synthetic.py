"""A learnable image dataset generated in memory from a fixed seed: no download, no files.

Class c is a sinusoidal grating at angle pi*c/K with a class colour; each sample gets a random
phase and Gaussian noise, so a model must learn orientation, not memorise pixels.
"""

from __future__ import annotations

import math

import torch

from ..config import DataConfig
from .in_memory import InMemoryDataset

_SPLIT_SEEDS = {"train": 1, "val": 2}


class SyntheticGratings(InMemoryDataset):
    def __init__(self, cfg: DataConfig, split: str):
        size, k = cfg.image_size, cfg.num_classes
        n = cfg.train_size if split == "train" else cfg.val_size
        g = torch.Generator().manual_seed(_SPLIT_SEEDS[split])
        labels = torch.randint(k, (n,), generator=g)
        phase = torch.rand(n, generator=g) * 2 * math.pi
        angle = labels.float() * math.pi / k
        coords = torch.linspace(-math.pi, math.pi, size)
        yy, xx = torch.meshgrid(coords, coords, indexing="ij")  # (S, S) each
        # Project every pixel on the class direction: (n, 1, 1) * (S, S) -> (n, S, S).
        along = angle.cos()[:, None, None] * xx + angle.sin()[:, None, None] * yy
        wave = torch.sin(2 * along + phase[:, None, None])
        colour = torch.rand(k, 3, generator=torch.Generator().manual_seed(0)) + 0.5  # (K, 3)
        images = colour[labels][:, :, None, None] * wave[:, None]  # (n, 3, S, S)
        self.x = (images + 1.5 * torch.randn(images.shape, generator=g)).contiguous()
        self.y = labels
        self.input_shape = (3, size, size)
        self.num_classes = k
