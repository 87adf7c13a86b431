"""A small convolutional classifier for images (N, C, H, W), built from named blocks."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn


@dataclass
class Options:
    width: int = 32  # channels of the first block; each further block doubles them
    depth: int = 2  # conv blocks, each halving height and width
    dropout: float = 0.1  # before the classifier head

    def checks(self):
        return [
            ("width", self.width >= 1, ">= 1"),
            ("depth", 1 <= self.depth <= 64, "between 1 and 64"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
        ]


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

    Options = Options

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, opts: Options):
        super().__init__()
        channels = [input_shape[0]] + [opts.width * 2**i for i in range(opts.depth)]
        # nn.Sequential (not a Python list) registers the blocks' parameters with the model.
        self.features = nn.Sequential(
            *(ConvBlock(a, b) for a, b in zip(channels, channels[1:], strict=False))
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Dropout(opts.dropout), nn.Linear(channels[-1], num_outputs))

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (N, C, H, W) -> (N, width * 2^(depth-1), H / 2^depth, W / 2^depth)
        x = self.pool(x).flatten(1)  # -> (N, C_last); flatten copes with non-contiguous input
        return self.head(x)  # -> (N, num_outputs) logits
