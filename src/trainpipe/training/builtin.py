"""trainpipe's built-in training functions, ``builtin:mlp`` and ``builtin:cnn``: classification or
regression on the snapshot's rows, written on the same public context as a team's function.

This module holds their settings (``train_config``), shared by both frameworks and checked before
any rank starts. With a torch backend they train :mod:`trainpipe.services.serving.nets`
(:mod:`trainpipe.training.torch.builtin`); with ``backend: tensorflow`` the Keras twin
(:mod:`trainpipe.training.tf.builtin`), whose weights are written in the torch layout so evaluation
and serving do not depend on the backend. Imports no framework.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainpipe.contract.config import StrictModel, build


class BuiltinConfig(StrictModel):
    """``train_config`` of the built-in functions."""

    hidden_units: list[int] = Field(default_factory=lambda: [64], description="MLP hidden layer widths")
    image_shape: list[int] | None = Field(
        None,
        description="cnn: [height, width] or [channels, height, width] of each row; default a square of the feature "
        "count",
    )
    learning_rate: float = Field(0.05, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, le=1)
    loss: Literal["auto", "cross_entropy", "mse", "huber", "mae"] = Field(
        "auto", description="auto: cross_entropy for classification, mse for regression"
    )

    @model_validator(mode="after")
    def _check(self) -> BuiltinConfig:
        if any(h < 1 or h > 65_536 for h in self.hidden_units):
            raise ValueError("hidden_units: every width must be between 1 and 65536")
        if self.image_shape is not None and (len(self.image_shape) not in (2, 3) or min(self.image_shape) < 1):
            raise ValueError("image_shape: give [height, width] or [channels, height, width], all positive")
        return self


def parse(config: dict[str, Any] | BuiltinConfig, task: str) -> BuiltinConfig:
    """The built-ins' settings from ``train_config`` (or as the function was given them), checked against
    the task; a wrong one is a one-line InputError."""
    from trainpipe.contract.errors import InputError

    cfg = config if isinstance(config, BuiltinConfig) else build(BuiltinConfig, config, where="train_config")
    if task == "classification" and cfg.loss not in ("auto", "cross_entropy"):
        raise InputError(
            f"train_config field 'loss': {cfg.loss} is a regression loss; classification uses cross_entropy"
        )
    if task == "regression" and cfg.loss == "cross_entropy":
        raise InputError(
            "train_config field 'loss': cross_entropy is a classification loss; regression takes mse, huber or mae"
        )
    return cfg


def image_shape(cfg: BuiltinConfig, features: int) -> list[int]:
    """``[C, H, W]`` of each row for the CNN."""
    import math

    from trainpipe.contract.errors import InputError

    if cfg.image_shape is None:
        side = math.isqrt(features)
        if side * side != features:
            raise InputError(
                f"train_config field 'image_shape': {features} feature columns are not a square image; set image_shape "
                "for builtin:cnn"
            )
        return [1, side, side]
    shape = [1, *cfg.image_shape] if len(cfg.image_shape) == 2 else list(cfg.image_shape)
    if math.prod(shape) != features:
        raise InputError(
            f"train_config field 'image_shape': {shape} holds {math.prod(shape)} values but the data has {features} "
            "feature columns"
        )
    return shape


def init_args(arch: str, cfg: BuiltinConfig, data: Any, task: str) -> dict[str, Any]:
    """What rebuilds the built-in net: ``nets.mlp(**args)`` or ``nets.cnn(**args)``."""
    args: dict[str, Any] = {"features": data.n_features, "n_outputs": data.n_outputs, "task": task}
    if arch == "cnn":
        args["image_shape"] = image_shape(cfg, data.n_features)
    else:
        args["hidden_units"] = list(cfg.hidden_units)
    return args


#: The built-in functions (``builtin:<name>``); each framework's module defines one of each name.
NAMES = ("mlp", "cnn")
#: What the built-in functions log each epoch (``ctx.log``), by task: all a tuning study's pruner can read of
#: their training curve (a validation metric such as log_loss is scored once a trial's training has ended).
EPOCH_LOGS: dict[str, tuple[str, ...]] = {"classification": ("loss", "accuracy"), "regression": ("loss",)}
