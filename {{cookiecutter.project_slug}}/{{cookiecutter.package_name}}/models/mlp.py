"""A multi-layer perceptron on flattened inputs: a baseline, and a model without BatchNorm."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn


@dataclass
class Options:
    width: int = 64  # hidden units per layer
    depth: int = 2  # hidden layers
    dropout: float = 0.1  # before the output layer

    def checks(self):
        return [
            ("width", self.width >= 1, ">= 1"),
            ("depth", 0 <= self.depth <= 64, "between 0 and 64"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
        ]


class MLP(nn.Module):
    """`depth` Linear-GELU layers of `width` units, then a linear head. Any input shape:
    (N, F) feature rows or (N, C, H, W) images, flattened."""

    Options = Options

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        layers, features = [], math.prod(input_shape)
        for _ in range(opts.depth):
            layers += [nn.Linear(features, opts.width), nn.GELU()]
            features = opts.width
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(opts.dropout), nn.Linear(features, num_outputs))

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)  # (N, C, H, W) -> (N, C*H*W); reshape semantics, works on any layout
        return self.head(self.body(x))  # -> (N, num_outputs): logits or values
