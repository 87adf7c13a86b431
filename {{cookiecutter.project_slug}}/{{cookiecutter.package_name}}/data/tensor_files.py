"""Your own data as tensor files: <data.root>/train.pt and val.pt, each {"x": (N, ...), "y": (N,)}.

Make them once from whatever arrays you have, e.g.
    x, y = torch.from_numpy(images).float(), torch.from_numpy(labels)
    torch.save({"x": x, "y": y}, "data/train.pt")
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DataConfig
from ..errors import ConfigError
from .in_memory import InMemoryDataset


class TensorFiles(InMemoryDataset):
    def __init__(self, cfg: DataConfig, split: str):
        path = Path(cfg.root) / f"{split}.pt"
        if not path.is_file():
            raise ConfigError(
                f"data file {str(path)!r} not found; put {split}.pt in data.root={cfg.root!r} "
                "(see data/tensor_files.py) or use data.name=synthetic"
            )
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            self.x, self.y = blob["x"], blob["y"].long()
        except Exception as exc:
            raise ConfigError(
                f"data file {str(path)!r} is not a dict of tensors 'x' and 'y' ({exc})"
            ) from None
        if len(self.x) != len(self.y):
            raise ConfigError(
                f"data file {str(path)!r}: {len(self.x)} inputs, {len(self.y)} labels"
            )
        self.input_shape = tuple(self.x.shape[1:])
        # Count classes over the training labels so train and val agree.
        labels = self.y if split == "train" else TensorFiles(cfg, "train").y
        self.num_classes = int(labels.max()) + 1
