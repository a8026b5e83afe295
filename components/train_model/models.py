"""Models train_model builds, and the loader every later step uses.

A model artifact is ``model.safetensors`` (weights only: loading never runs
code) plus ``model.json`` (architecture, feature columns, classes, scaling).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from trainpipe.components.train_model.spec import MODEL_FILE, MODEL_META
from trainpipe.contract.errors import InputError


def build_mlp(input_dim: int, hidden_units: list[int], n_outputs: int) -> Any:
    """A plain MLP for tabular data: Linear → ReLU per hidden width, then a linear head."""
    import torch.nn as nn

    layers: list[Any] = []
    width = input_dim
    for h in hidden_units:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


def build_cnn(input_shape: list[int], n_outputs: int) -> Any:
    """A small CNN for image-shaped rows (the digits are 1x8x8).

    It takes flat rows, like every trainpipe model, and unflattens them to
    ``[C, H, W]`` itself, so serving and evaluation feed it the same table rows.
    """
    import torch.nn as nn

    c, h, w = input_shape
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (h // 2) * (w // 2), 64),
        nn.ReLU(),
        nn.Linear(64, n_outputs),
    )


def resolve_entry_point(spec: str) -> Callable[..., Any]:
    """Import ``package.module:function``.

    Raises:
        InputError: the module or the function cannot be found.
    """
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"model: cannot import {module_name!r} for {spec!r}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise InputError(f"model: {module_name!r} has no function {func_name!r}")
    return func


def build_model(arch: str, input_shape: list[int], n_outputs: int, hidden_units: list[int], model_kwargs: dict[str, Any] | None = None) -> Any:
    """The torch model for ``arch``: ``mlp``, ``cnn`` or a user's ``package.module:function``.

    A user's function is called as ``function(input_shape=[...], n_classes=N, **model_kwargs)``
    and must return a ``torch.nn.Module`` that maps a batch of flat feature rows
    ``(batch, features)`` to logits ``(batch, N)``.

    Raises:
        InputError: the entry point cannot be imported or returns something else.
    """
    import math

    import torch.nn as nn

    if arch == "mlp":
        return build_mlp(math.prod(input_shape), hidden_units, n_outputs)
    if arch == "cnn":
        return build_cnn(input_shape, n_outputs)
    func = resolve_entry_point(arch)
    try:
        model = func(input_shape=list(input_shape), n_classes=n_outputs, **(model_kwargs or {}))
    except TypeError as exc:
        raise InputError(f"model: {arch} cannot be called as f(input_shape=..., n_classes=..., **model_kwargs): {exc}") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"model: {arch} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def read_meta(model_dir: str | Path) -> dict[str, Any]:
    """Read ``model.json`` of a model artifact."""
    path = Path(model_dir) / MODEL_META
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"model: {str(path)!r} does not exist (not a train_model artifact)") from None
    except ValueError as exc:
        raise InputError(f"model: {str(path)!r} is not valid JSON: {exc}") from None


TRUSTED_ENV = "TRAINPIPE_TRUSTED_MODEL_CODE"


def trusted_code(entry_point: str) -> bool:
    """Whether a model artifact may name ``entry_point`` as the code that builds it.

    A model artifact is data: one that is not ours must never choose what runs. Its
    architecture function is imported only when its module (or a parent package) is listed
    in ``TRAINPIPE_TRUSTED_MODEL_CODE`` (comma-separated), which a platform sets on its pods.
    """
    module = entry_point.partition(":")[0]
    trusted = [m.strip() for m in os.environ.get(TRUSTED_ENV, "").split(",") if m.strip()]
    return any(module == t or module.startswith(t + ".") for t in trusted)


def load_model(model_dir: str | Path) -> tuple[Any, dict[str, Any]]:
    """Load a trained model for inference, weights only (safetensors).

    Returns:
        ``(module in eval mode, meta)``.

    Raises:
        InputError: the artifact is incomplete or its weights do not match its architecture.
    """
    from safetensors.torch import load_file

    meta = read_meta(model_dir)
    arch = str(meta.get("arch", ""))
    if arch not in ("mlp", "cnn") and ":" not in arch:
        raise InputError(f"model: unsupported architecture {arch!r}")
    if ":" in arch and not trusted_code(arch):
        raise InputError(
            f"model: the artifact names code to build it ({arch!r}), which is not trusted here; "
            f"a platform that trusts it lists its module in {TRUSTED_ENV}"
        )
    shape = list(meta.get("input_shape") or [int(meta["input_dim"])])
    model = build_model(arch, shape, len(meta["classes"]), list(meta.get("hidden_units", [])), meta.get("model_kwargs"))
    try:
        state = load_file(str(Path(model_dir) / MODEL_FILE))
        model.load_state_dict(state)
    except Exception as exc:
        raise InputError(f"model: weights in {str(Path(model_dir) / MODEL_FILE)!r} cannot be loaded: {str(exc).splitlines()[0]}") from None
    model.eval()
    return model, meta


def predict_proba(model: Any, meta: dict[str, Any], x: Any) -> Any:
    """Class probabilities for raw feature rows (scaling from ``meta`` applied)."""
    import numpy as np
    import torch

    mean = np.asarray(meta["mean"], dtype=np.float32)
    std = np.asarray(meta["std"], dtype=np.float32)
    xs = torch.from_numpy(((np.asarray(x, dtype=np.float32) - mean) / std).astype(np.float32))
    with torch.no_grad():
        return torch.softmax(model(xs), dim=1).numpy()


def serving_module(model: Any, meta: dict[str, Any]) -> Any:
    """The module to serve: raw features in, class probabilities out (scaling built in).

    This is what register_model logs with the MLflow pytorch flavor, so a model
    loaded back from the registry predicts on raw rows exactly as evaluation did.
    """
    import sys

    import torch

    serving_cls = getattr(sys.modules[__name__], "_Serving")
    return serving_cls(model, torch.tensor(meta["mean"], dtype=torch.float32), torch.tensor(meta["std"], dtype=torch.float32))


def _serving_class() -> Any:
    import torch

    class Serving(torch.nn.Module):
        def __init__(self, model: Any, mean: Any, std: Any) -> None:
            super().__init__()
            self.model = model
            self.register_buffer("mean", mean)
            self.register_buffer("std", std)

        def forward(self, x: Any) -> Any:
            return torch.softmax(self.model((x.float() - self.mean) / self.std), dim=1)

    Serving.__module__ = __name__
    Serving.__qualname__ = "_Serving"
    return Serving


def __getattr__(name: str) -> Any:
    # The serving class subclasses torch.nn.Module; it is built on first use so that
    # importing this module stays free of torch, and stays picklable by name.
    if name == "_Serving":
        cls = _serving_class()
        globals()["_Serving"] = cls
        return cls
    raise AttributeError(name)
