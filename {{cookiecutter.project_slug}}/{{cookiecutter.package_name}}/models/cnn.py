"""A small convolutional classifier built from semantic blocks (seed §3.3)."""

from __future__ import annotations

from torch import Tensor, nn


class ConvBlock(nn.Module):
    """Two 3x3 conv-BN-ReLU layers and 2x pooling: (N, C_in, H, W) -> (N, C_out, H/2, W/2)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.layers = nn.Sequential(
            # bias is redundant before BatchNorm, which re-centres every channel.
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class SmallCNN(nn.Module):
    """`depth` ConvBlocks doubling the channels from `width`, global pooling, a linear head."""

    def __init__(self, input_shape, num_classes: int, width: int, depth: int, dropout: float):
        super().__init__()
        channels = [input_shape[0]] + [width * 2**i for i in range(depth)]
        # nn.Sequential (not a Python list) registers the blocks' parameters with the model.
        self.features = nn.Sequential(
            *(ConvBlock(a, b) for a, b in zip(channels, channels[1:], strict=False))
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels[-1], num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (N, C, H, W) -> (N, width * 2^(depth-1), H / 2^depth, W / 2^depth)
        x = self.pool(x).flatten(1)  # -> (N, C_last); flatten copes with non-contiguous input
        return self.head(x)  # -> (N, num_classes) logits
