"""A TensorFlow training's saved model: the Keras weights (in order) with how to rebuild them, or,
for the built-in nets, the same weights in the torch layout, so evaluation and serving do not depend
on the backend that trained them. Imports TensorFlow and NumPy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_bytes, atomic_write_json


def example_frame(input_example: Any, tabular: Any, data: Any, label_column: str) -> Any:
    """The rows the saved model is proven on: the function's own, else a few of the snapshot's."""
    import pandas as pd

    if input_example is not None:
        if not isinstance(input_example, pd.DataFrame) or len(input_example) == 0:
            raise InputError("save_model: input_example must be a non-empty DataFrame of raw feature columns")
        return input_example
    if tabular is None:
        raise InputError("save_model: give input_example (a DataFrame of raw feature rows)")
    from trainpipe.training.data import example_rows

    return example_rows(tabular, data, label_column)


def builtin_weights(
    model: Any, builder: str, tabular: Any, task: str, raw: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    """A built-in Keras net's weights in the torch layout, and its raw outputs on that scale."""
    from trainpipe.training.tf.builtin import torch_state_dict

    target = (float(tabular.target_mean), float(tabular.target_std))
    weights = torch_state_dict(model, builder.split(":", 1)[1], tabular.mean, tabular.std, task, target)
    if task == "regression":
        raw = raw[:, 0] * target[1] + target[0]
    return weights, raw


def write_model(out: Path, weights: dict[str, np.ndarray], meta: dict[str, Any], example: Any, raw: np.ndarray) -> None:
    """model.safetensors, model.json and the examples (the chief's)."""
    from safetensors.numpy import save

    from trainpipe.services.serving import loader
    from trainpipe.services.serving.package import write_examples

    try:
        json.dumps(meta["init_args"])
    except TypeError as exc:
        raise InputError(f"save_model: init_args must be JSON-able: {exc}") from None
    meta = {**meta, "format": loader.FORMAT, "feature_columns": [str(c) for c in example.columns]}
    atomic_write_bytes(out / loader.MODEL_FILE, save({k: np.ascontiguousarray(v) for k, v in weights.items()}))
    atomic_write_json(out / loader.MODEL_META, meta)
    write_examples(out, example, loader.outputs_frame(raw, meta["task"], list(meta["classes"]), None))
