"""Load a trained model from its weights-only artifact and predict on a table of raw features.

A model artifact is two files: ``model.safetensors`` (weights: reading it runs no code) and
``model.json`` (what to build: ``builder`` with ``init_args``, the feature columns, the task and
classes). The builder is trainpipe's own (``builtin:mlp``, ``builtin:cnn``) or a team's
(``package.module:Callable``), imported only when the caller trusts its module.

This file and ``nets.py`` are copied into every registered MLflow model, so it imports nothing of
trainpipe: evaluate_model, register_model and a served model load a model the same way.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL_FILE = "model.safetensors"
MODEL_META = "model.json"
#: An optimized model's graph, beside its ``model.json`` (the ONNX pyfunc reads it).
ONNX_FILE = "model.onnx"
FORMAT = "trainpipe-model/2"


class ModelError(ValueError):
    """The artifact is incomplete, untrusted, or its weights do not fit what it says it is."""


def read_meta(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / MODEL_META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{str(path)!r} does not exist (not a trainpipe model artifact)") from None
    except ValueError as exc:
        raise ModelError(f"{str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelError(
            f"{str(path)!r} is not a {FORMAT} model description (format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r})"
        )
    for key in ("builder", "init_args", "feature_columns", "task"):
        if key not in meta:
            raise ModelError(f"{str(path)!r} lacks {key!r}")
    return meta


def resolve_builder(builder: str, trusted: Callable[[str], bool]) -> Callable[..., Any]:
    """The callable ``builder`` names: ``builtin:<name>`` or ``package.module:Qual.name``.

    Raises:
        ModelError: the module is not trusted, cannot be imported, or lacks the name.
    """
    if builder.startswith("builtin:"):
        from . import nets

        fn = nets.BUILDERS.get(builder.split(":", 1)[1])
        if fn is None:
            raise ModelError(f"unknown built-in model {builder!r}")
        return fn
    module_name, sep, qualname = builder.partition(":")
    if not sep or not module_name or not qualname:
        raise ModelError(f"builder {builder!r} is not 'package.module:Name'")
    if not trusted(module_name):
        raise ModelError(f"the artifact names code to build it ({builder!r}), which is not trusted here")
    try:
        obj: Any = importlib.import_module(module_name)  # noqa: TID251 (travels without trainpipe; trusted only)
    except ImportError as exc:
        raise ModelError(f"cannot import {module_name!r} for {builder!r}: {exc}") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ModelError(f"{module_name!r} has no {qualname!r}")
    if not callable(obj):
        raise ModelError(f"{builder!r} is not callable")
    return obj


class LoadedModel:
    """A model ready to predict on raw feature rows, in eval mode."""

    def __init__(self, module: Any, meta: dict[str, Any]) -> None:
        self.module = module
        self.meta = meta
        self.feature_columns: list[str] = [str(c) for c in meta["feature_columns"]]
        self.task: str = meta["task"]
        self.classes: list[Any] = list(meta.get("classes") or [])

    def features(self, frame: Any) -> Any:
        """The feature matrix (float32) of a DataFrame, in the trained column order."""
        import numpy as np

        missing = [c for c in self.feature_columns if c not in frame.columns]
        if missing:
            raise ModelError(f"input lacks the feature columns {', '.join(missing[:5])}")
        return frame[self.feature_columns].to_numpy(dtype=np.float32)

    def raw_output(self, x: Any, batch: int = 65536) -> Any:
        """The module's output on a float32 matrix, in chunks: logits (classification) or values."""
        import numpy as np
        import torch

        outs = []
        with torch.no_grad():
            for i in range(0, max(len(x), 1), batch):  # an empty input still gives (0, outputs)
                outs.append(self.module(torch.from_numpy(np.ascontiguousarray(x[i : i + batch]))).float().numpy())
        out = np.concatenate(outs).reshape(len(x), -1)
        if self.task == "regression" and out.shape[1] == 1:
            return out[:, 0]
        return out

    def predict_proba(self, x: Any) -> Any:
        """Class probabilities (classification) of a float32 matrix."""
        import numpy as np

        logits = self.raw_output(x).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)

    def predict_values(self, x: Any) -> Any:
        """Predicted values (regression) of a float32 matrix."""
        return self.raw_output(x)

    def predict_frame(self, frame: Any) -> Any:
        """A DataFrame of predictions: ``prediction`` (the class label or the value) and, for a
        classifier, ``probability_<class>`` for every class."""
        return outputs_frame(self.raw_output(self.features(frame)), self.task, self.classes, frame.index)


class KerasModel(LoadedModel):
    """A team's Keras model (trained with backend tensorflow), rebuilt and loaded the same way."""

    def raw_output(self, x: Any, batch: int = 65536) -> Any:
        import numpy as np

        out = np.concatenate(
            [
                np.asarray(self.module(x[i : i + batch], training=False), dtype=np.float32)
                for i in range(0, max(len(x), 1), batch)
            ]
        ).reshape(len(x), -1)
        return out[:, 0] if self.task == "regression" and out.shape[1] == 1 else out


def outputs_frame(raw: Any, task: str, classes: list[Any], index: Any = None) -> Any:
    """The predictions DataFrame of raw model outputs (logits or values): one shape for every model."""
    import numpy as np
    import pandas as pd

    if task == "classification":
        logits = np.asarray(raw, dtype=np.float64).reshape(len(raw), -1)
        logits = logits - logits.max(axis=1, keepdims=True)
        proba = np.exp(logits)
        proba /= proba.sum(axis=1, keepdims=True)
        names = list(classes) or list(range(proba.shape[1]))
        labels = np.asarray(names, dtype=object)[proba.argmax(axis=1)]
        cols: dict[str, Any] = {"prediction": list(labels)}
        cols.update({f"probability_{c}": proba[:, i] for i, c in enumerate(names)})
        return pd.DataFrame(cols, index=index)
    values = np.asarray(raw)
    if values.ndim == 1:
        return pd.DataFrame({"prediction": values}, index=index)
    return pd.DataFrame({f"prediction_{i}": values[:, i] for i in range(values.shape[1])}, index=index)


def load(model_dir: str | Path, trusted: Callable[[str], bool] = lambda module: False) -> LoadedModel:
    """Rebuild the model ``model.json`` describes and load its safetensors weights (strict).

    Args:
        model_dir: The folder holding ``model.json`` and ``model.safetensors``.
        trusted: Whether a module may be imported to build the model (built-ins always may).

    Raises:
        ModelError: a missing or foreign file, untrusted or missing code, or weights that do not fit.
    """
    meta = read_meta(model_dir)
    framework = meta.get("framework", "torch")
    if framework not in ("torch", "tensorflow"):
        raise ModelError(f"framework {framework!r} is not served by this loader")
    builder = resolve_builder(str(meta["builder"]), trusted)
    if framework == "tensorflow":
        return _load_keras(model_dir, meta, builder)
    try:
        module = builder(**dict(meta["init_args"]))
    except Exception as exc:
        raise ModelError(f"{meta['builder']}(**init_args) failed: {_first_line(exc)}") from None
    from safetensors.torch import load_file

    weights = Path(model_dir) / MODEL_FILE
    try:
        module.load_state_dict(load_file(str(weights)), strict=True)
    except Exception as exc:
        raise ModelError(
            f"weights in {str(weights)!r} cannot be loaded into {meta['builder']}: {_first_line(exc)}"
        ) from None
    module.eval()
    return LoadedModel(module, meta)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _load_keras(model_dir: str | Path, meta: dict[str, Any], builder: Callable[..., Any]) -> LoadedModel:
    """A Keras model: built by its builder, weights assigned in order from ``model.safetensors``."""
    from safetensors.numpy import load_file

    try:
        model = builder(**dict(meta["init_args"]))
        model.build((None, len(meta["feature_columns"])))
    except Exception as exc:
        raise ModelError(f"{meta['builder']}(**init_args) failed: {_first_line(exc)}") from None
    weights = Path(model_dir) / MODEL_FILE
    try:
        stored = load_file(str(weights))
        values = [stored[k] for k in sorted(stored)]
        if len(values) != len(model.weights):
            raise ValueError(f"{len(values)} tensors for {len(model.weights)} weights")
        for var, value in zip(model.weights, values, strict=True):
            var.assign(value)
    except Exception as exc:
        raise ModelError(
            f"weights in {str(weights)!r} cannot be loaded into {meta['builder']}: {_first_line(exc)}"
        ) from None
    return KerasModel(model, meta)
