"""trainpipe's built-in networks for tabular rows: an MLP and a small CNN.

Both take raw feature rows ``(batch, features)`` and carry their scaling inside (feature mean and
std as buffers, and for regression the target's), so a served model is fed the table's columns
as they are. This file imports torch only: it is copied into every registered MLflow model, which
then loads where trainpipe is not installed.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Standardize(nn.Module):
    """``(x - mean) / std`` with the statistics as buffers (saved with the weights)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Rescale(nn.Module):
    """``y * std + mean``: a regression head's output on the target's own scale."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(1))
        self.register_buffer("std", torch.ones(1))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std + self.mean


class TabularNet(nn.Module):
    """Standardize → body → head; regression nets end in :class:`Rescale` and return ``(batch,)``."""

    def __init__(self, features: int, body: nn.Module, head_in: int, n_outputs: int, task: str) -> None:
        super().__init__()
        if task not in ("classification", "regression"):
            raise ValueError(f"task must be classification or regression, not {task!r}")
        self.task = task
        self.norm = Standardize(features)
        self.body = body
        self.head = nn.Linear(head_in, n_outputs)
        self.out = Rescale() if task == "regression" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.body(self.norm(x.float())))
        return self.out(y.squeeze(-1)) if self.task == "regression" else y


def mlp(features: int, n_outputs: int, hidden_units: list[int], task: str = "classification") -> TabularNet:
    """Linear → ReLU per hidden width, then a linear head."""
    layers: list[nn.Module] = []
    width = features
    for h in hidden_units:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return TabularNet(features, nn.Sequential(*layers), width, n_outputs, task)


def cnn(features: int, n_outputs: int, image_shape: list[int], task: str = "classification") -> TabularNet:
    """Rows reshaped to ``[C, H, W]``; two 3x3 convolutions, a max-pool, a dense layer, the head."""
    c, h, w = image_shape
    if c * h * w != features:
        raise ValueError(f"image_shape {image_shape} holds {c * h * w} values, not {features}")
    body = nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (h // 2) * (w // 2), 64),
        nn.ReLU(),
    )
    return TabularNet(features, body, 64, n_outputs, task)


def square_image(features: int) -> list[int]:
    """``[1, side, side]`` when ``features`` is a square, else ValueError."""
    side = math.isqrt(features)
    if side * side != features:
        raise ValueError(f"{features} feature columns are not a square image")
    return [1, side, side]


#: What ``builtin:<name>`` names in a model's ``builder``.
BUILDERS = {"mlp": mlp, "cnn": cnn}
