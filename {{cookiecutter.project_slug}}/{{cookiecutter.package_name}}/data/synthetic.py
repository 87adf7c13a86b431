"""A learnable image dataset generated in memory from a fixed seed: no download, no files.

Class c is a sinusoidal grating at angle pi*c/K with a class colour; each sample gets a random
phase and Gaussian noise, so a model must learn orientation, not memorise pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .in_memory import InMemoryDataset

_SPLIT_SEEDS = {"train": 1, "val": 2}


@dataclass
class Options:
    train_size: int = 4096  # samples in the training split
    val_size: int = 1024  # samples in the validation split
    image_size: int = 16  # height = width of the images
    num_classes: int = 10  # number of classes

    def checks(self):
        return [
            ("train_size", self.train_size >= 1, ">= 1"),
            ("val_size", self.val_size >= 1, ">= 1"),
            ("image_size", self.image_size >= 4, ">= 4"),
            ("num_classes", self.num_classes >= 2, ">= 2"),
        ]


class SyntheticGratings(InMemoryDataset):
    Options = Options

    def __init__(self, opts: Options, split: str):
        size, k = opts.image_size, opts.num_classes
        n = opts.train_size if split == "train" else opts.val_size
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
        self.num_classes = k
        self.meta = {"classes": [f"angle_{c}" for c in range(k)], "image_size": size}
