"""The built-in training functions on torch backends (``builtin:mlp``, ``builtin:cnn``): the nets of
:mod:`trainpipe.services.serving.nets` trained on the snapshot's rows, SGD with momentum, on the same public
context as a team's function. Imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from trainpipe.services.serving import nets
from trainpipe.training.builtin import BuiltinConfig, init_args, parse


def tabular(ctx: Any, config: BuiltinConfig, arch: str) -> None:
    """Train the built-in net on the snapshot (torch backends)."""
    task = ctx.settings.task
    cfg = parse(config, task)
    data = ctx.data.load()
    args = init_args(arch, cfg, data, task)
    builder: Callable[..., Any] = nets.BUILDERS[arch]
    net = builder(**args)
    with torch.no_grad():  # the scaling travels inside the model: it serves raw rows
        net.norm.mean.copy_(torch.tensor(data.mean))
        net.norm.std.copy_(torch.tensor(data.std))
        if task == "regression":
            net.out.mean.fill_(data.target_mean)
            net.out.std.fill_(data.target_std)
    model = ctx.prepare(net)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.learning_rate, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    ctx.restore(model=model, optimizer=opt)
    scale = float(data.target_std)
    regression_loss: Any = {
        "auto": F.mse_loss,
        "mse": F.mse_loss,
        "huber": F.huber_loss,
        "mae": F.l1_loss,
    }[cfg.loss]
    for x, y in ctx.batches(data):
        with ctx.autocast():
            out = model(x)
        if task == "classification":
            loss = F.cross_entropy(out.float(), y)
            ctx.backward(loss)
            ctx.step(opt)
            ctx.log(loss=loss, accuracy=(out.argmax(1) == y).float().mean())
        else:
            loss = regression_loss(out.float() / scale, y / scale)  # on the target's standard scale
            ctx.backward(loss)
            ctx.step(opt)
            ctx.log(loss=loss)
    ctx.save_model(model, builder=f"builtin:{arch}", init_args=args)


def mlp(ctx: Any, config: BuiltinConfig) -> None:
    """``builtin:mlp``: an MLP on the rows (``hidden_units``), SGD with momentum."""
    tabular(ctx, config, "mlp")


def cnn(ctx: Any, config: BuiltinConfig) -> None:
    """``builtin:cnn``: rows as images (``image_shape``), two convolutions, a dense layer; SGD with momentum."""
    tabular(ctx, config, "cnn")
