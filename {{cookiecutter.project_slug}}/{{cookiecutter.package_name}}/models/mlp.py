"""A multi-layer perceptron on flattened inputs: a baseline, and a model without BatchNorm."""

from __future__ import annotations

import math

from torch import Tensor, nn


class MLP(nn.Module):
    """`depth` Linear-GELU layers of `width` units, then a linear head."""

    def __init__(self, input_shape, num_classes: int, width: int, depth: int, dropout: float):
        super().__init__()
        layers, features = [], math.prod(input_shape)
        for _ in range(depth):
            layers += [nn.Linear(features, width), nn.GELU()]
            features = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)  # (N, C, H, W) -> (N, C*H*W); reshape semantics, works on any layout
        return self.head(self.body(x))  # -> (N, num_classes) logits
