"""A torch training's model as train_model hands it on: ``model.safetensors`` (weights only),
``model.json`` (how to rebuild it) and example rows, proven to load and predict before the run
ends. Imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_bytes, atomic_write_json


def model_class(module: torch.nn.Module) -> type:
    """The team's own class of a module: FSDP2's ``fully_shard`` swaps it for a class it makes on
    the fly (``FSDP<Name>``, which no one can import to rebuild the model)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def write_model(
    out: Path,
    state: dict[str, torch.Tensor],
    module: torch.nn.Module,
    meta: dict[str, Any],
    input_example: Any,
    init_args: dict[str, Any] | None,
    builder: Any,
    classes: list[Any] | None,
    task: str,
) -> None:
    """Write the model and prove that it loads: rebuilt from its description, weights strict,
    predicting on the example (rank 0 only).

    Raises:
        InputError: it cannot be rebuilt from what is given, its code cannot travel, or it fails
            on the example.
    """
    import pandas as pd
    from safetensors.torch import save

    from trainpipe.serving import loader
    from trainpipe.serving.package import write_examples
    from trainpipe.training.builders import builder_reference

    builder_ref, code = builder_reference(builder if builder is not None else model_class(module))
    if not isinstance(input_example, pd.DataFrame) or len(input_example) == 0:
        raise InputError("save_model: input_example must be a non-empty DataFrame of raw feature columns")
    try:
        json.dumps(init_args or {})
    except TypeError as exc:
        raise InputError(f"save_model: init_args must be JSON-able: {exc}") from None
    weights = {k: v.detach().to("cpu").clone().contiguous() for k, v in state.items()}
    meta = {
        **meta,
        "format": loader.FORMAT,
        "framework": "torch",
        "builder": builder_ref,
        "init_args": init_args or {},
        "code": code,
        "task": task,
        "classes": list(classes or []),
        "feature_columns": [str(c) for c in input_example.columns],
    }
    atomic_write_bytes(out / loader.MODEL_FILE, save(weights))
    atomic_write_json(out / loader.MODEL_META, meta)
    try:
        loaded = loader.load(out, trusted=lambda m: True)
        output = loaded.predict_frame(input_example)
    except loader.ModelError as exc:
        raise InputError(f"save_model: the model cannot be rebuilt for serving: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (the team's model failing on its example, in one line)
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise InputError(
            f"save_model: the rebuilt model fails on input_example: {type(exc).__name__}: {first}"
        ) from None
    if task == "classification" and classes and output.shape[1] != 1 + len(classes):
        raise InputError(
            f"save_model: the model gives {output.shape[1] - 1} outputs but there are {len(classes)} classes"
        )
    write_examples(out, input_example, output)
