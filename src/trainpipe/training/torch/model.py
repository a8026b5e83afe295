"""A torch training's model as train_model hands it on: ``model.safetensors`` (weights only),
``model.json`` (how to rebuild it) and example rows, proven to load and predict before the run
ends.

The proof costs no second pass over the weights: the model is rebuilt from its description on the
meta device (no initialisation of weights about to be replaced), the host copy of the weights is
assigned to it (strict: every name, shape and dtype), it predicts on the example, and the file's
header is checked to name the same tensors. A builder that cannot be built on the meta device is
rebuilt the way a server does (:func:`trainpipe.services.serving.loader.load`). Imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json


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
    *,
    shared: Path | None = None,
    host_copy: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write the model and prove that it loads: rebuilt from its description, weights strict,
    predicting on the example (rank 0 only).

    Args:
        shared: A safetensors file that holds ``state`` already (the last checkpoint's): the model's
            weights become a second name of it instead of a second write.
        host_copy: ``state`` in host memory, when there is one already (a checkpoint's staged copy).

    Raises:
        InputError: it cannot be rebuilt from what is given, its code cannot travel, or it fails
            on the example.
    """
    import pandas as pd

    from trainpipe.services.serving import loader
    from trainpipe.services.serving.package import write_examples
    from trainpipe.training import weights_file
    from trainpipe.training.builders import builder_reference

    builder_ref, code = builder_reference(builder if builder is not None else model_class(module))
    if not isinstance(input_example, pd.DataFrame) or len(input_example) == 0:
        raise InputError("save_model: input_example must be a non-empty DataFrame of raw feature columns")
    try:
        json.dumps(init_args or {})
    except TypeError as exc:
        raise InputError(f"save_model: init_args must be JSON-able: {exc}") from None
    # host tensors as they are (the file is written before training could change them), device ones copied once
    weights = host_copy if host_copy is not None else {k: v.detach().to("cpu") for k, v in state.items()}
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
    if shared is not None:
        weights_file.share(shared, out / loader.MODEL_FILE)
    elif weights_file.writable(weights):
        weights_file.write(out / loader.MODEL_FILE, weights)
    else:  # a dtype safetensors' own writer knows and ours does not (float8 …)
        from safetensors.torch import save

        from trainpipe.contract.io import atomic_write_bytes

        atomic_write_bytes(out / loader.MODEL_FILE, save({k: v.contiguous() for k, v in weights.items()}))
    atomic_write_json(out / loader.MODEL_META, meta)
    try:
        loaded = _rebuilt(out, meta, weights)
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


def _rebuilt(out: Path, meta: dict[str, Any], weights: dict[str, torch.Tensor]) -> Any:
    """The model rebuilt from ``meta`` with ``weights`` assigned (see the module's docstring), after the
    written file's header is checked against them.

    Raises:
        ModelError: it cannot be rebuilt, or the weights (or the file) do not fit it.
    """
    import itertools

    from trainpipe.services.serving import loader
    from trainpipe.training import weights_file

    written = weights_file.read_header(out / loader.MODEL_FILE)
    expected = {
        k: {"dtype": weights_file.DTYPES.get(str(v.dtype).removeprefix("torch."), ""), "shape": list(v.shape)}
        for k, v in weights.items()
    }
    if {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in written.items()} != expected:
        raise loader.ModelError(f"{loader.MODEL_FILE} does not hold the weights it was written from")
    builder = loader.resolve_builder(str(meta["builder"]), lambda module: True)
    try:
        with torch.device("meta"):
            module = builder(**dict(meta["init_args"]))
    except Exception:  # noqa: BLE001 (a builder that needs real tensors: rebuilt as a server does)
        return loader.load(out, trusted=lambda m: True)
    if not isinstance(module, torch.nn.Module) or any(
        k in weights and weights[k].dtype != v.dtype for k, v in module.state_dict().items()
    ):  # a server copies the weights into the built module's own dtypes: so does the proof
        return loader.load(out, trusted=lambda m: True)
    try:
        module.load_state_dict(weights, strict=True, assign=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise loader.ModelError(
            f"weights in {str(out / loader.MODEL_FILE)!r} cannot be loaded into {meta['builder']}: {first}"
        ) from None
    if any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers())):
        return loader.load(out, trusted=lambda m: True)  # a buffer the weights do not hold (not persistent)
    module.eval()
    return loader.LoadedModel(module, meta)
