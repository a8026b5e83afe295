"""optimize_model's variants: the fp32 model exported to ONNX, quantized (dynamic, static with calibration rows)
and pruned (then fine-tuned), each measured as it is made. torch, onnx and onnxruntime are imported inside
the functions."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.optimize_model.measurement import (
    _drop,
    _Measure,
    ort_predict,
    ort_session,
    task_metrics,
    torch_predict,
)
from trainpipe.components.optimize_model.spec import (
    VARIANTS,
    OptimizeModelConfig,
    Variant,
)
from trainpipe.contract.errors import InputError
from trainpipe.contract.layout import MODEL_FILE

#: Training rows read at most (the first ones of the training side): calibration and fine-tuning.
TRAINING_ROWS = 100_000
INPUT_NAME = "features"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' and quantizers' progress lines and warnings stay out of the task log."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "root")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _unexportable_op(text: str) -> str | None:
    """The operator an exporter's message says it has no ONNX translation for."""
    for pattern in (
        r"No ONNX function found for <OpOverload\(op='([^']+)'",
        r"target=torch\.ops\.([\w.]+)\.default",
        r"operator '([^']+)' to ONNX",
        r"Unsupported: .*?(aten[.:][\w.]+)",
    ):
        m = re.search(pattern, text)
        if m:
            return m.group(1).replace("::", ".")
    return None


def export_onnx(module: Any, example: Any, path: Path) -> str:
    """Export ``module`` to ``path`` with a dynamic batch: the dynamo exporter, else TorchScript's.

    Returns:
        Which exporter made the file: ``dynamo`` or ``torchscript``.

    Raises:
        InputError: neither exporter can translate the model (naming the operator when one is to blame).
    """
    import torch

    ex = torch.from_numpy(example)
    errors = []
    with _quiet():
        try:
            program = torch.onnx.export(
                module,
                (ex,),
                dynamo=True,
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                input_names=[INPUT_NAME],
                output_names=["output"],
                verbose=False,
            )
            program.save(str(path))
            return "dynamo"
        except Exception as exc:  # the exporter raises its own error types for every kind of failure
            errors.append(f"{exc}\n{exc.__cause__ or ''}")
        try:
            torch.onnx.export(
                module,
                (ex,),
                str(path),
                dynamo=False,
                input_names=[INPUT_NAME],
                output_names=["output"],
                dynamic_axes={INPUT_NAME: {0: "batch"}, "output": {0: "batch"}},
                opset_version=18,
            )
            return "torchscript"
        except Exception as exc:
            errors.append(str(exc))
    path.unlink(missing_ok=True)
    op = next((o for o in map(_unexportable_op, errors) if o), None)
    if op:
        raise InputError(
            f"model: ONNX cannot export it: no ONNX translation for the operator {op} (dynamo and TorchScript "
            "exporters)"
        )
    first = next(
        (line.strip() for line in errors[0].splitlines() if line.strip() and "step" not in line), "unknown error"
    )
    raise InputError(f"model: ONNX cannot export it: {first[:300]}")


class _Rows:
    """An onnxruntime CalibrationDataReader over a float32 matrix, 64 rows at a time."""

    def __init__(self, x: Any) -> None:
        self._it = iter([{INPUT_NAME: x[i : i + 64]} for i in range(0, len(x), 64)])

    def get_next(self) -> dict[str, Any] | None:
        return next(self._it, None)


def quantize(src: Path, dest: Path, mode: str, calibration: Any = None) -> None:
    """int8 with ONNX Runtime's tools: ``dynamic`` (weights int8, activations quantized per call) or
    ``static`` (QDQ, activation ranges calibrated on ``calibration``); the model is shape-inferred first."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    reader = type("Rows", (_Rows, CalibrationDataReader), {})
    with _quiet(), tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        if mode == "dynamic":
            quantize_dynamic(str(pre), str(dest), weight_type=QuantType.QInt8)
        else:
            quantize_static(
                str(pre),
                str(dest),
                reader(calibration),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
            )


def prunable(module: Any) -> list[tuple[str, Any]]:
    """Every Linear and Conv layer but the last (the head keeps every output)."""
    from torch import nn

    layers = [(n, m) for n, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
    return layers[:-1]


def prune(module: Any, sparsity: float, kind: str) -> list[tuple[Any, str]]:
    """Apply pruning masks in place (``torch.nn.utils.prune``; the masks hold through fine-tuning).

    Raises:
        InputError: no layer can be pruned, or structured pruning would remove every unit of a layer.
    """
    from torch.nn.utils import prune as tprune

    layers = prunable(module)
    if not layers:
        raise InputError("variants: pruned needs a Linear or Conv layer besides the last one, and this model has none")
    params = [(m, "weight") for _, m in layers]
    if kind == "unstructured":
        tprune.global_unstructured(params, pruning_method=tprune.L1Unstructured, amount=sparsity)
        return params
    for name, m in layers:
        units = int(m.weight.shape[0])
        k = round(sparsity * units)
        if k >= units:
            raise InputError(
                f"sparsity: {sparsity} structured removes all {units} units of layer {name}; at most "
                f"{(units - 1) / units:.3f} "
                "keeps one"
            )
        tprune.ln_structured(m, "weight", amount=k, n=2, dim=0)
    return params


def zero_share(params: list[tuple[Any, str]]) -> float:
    total = sum(int(getattr(m, n).numel()) for m, n in params)
    zeros = sum(int((getattr(m, n) == 0).sum()) for m, n in params)
    return zeros / max(total, 1)


def fine_tune(module: Any, task: str, classes: list[Any], x: Any, y_raw: Any, epochs: int, seed: int) -> None:
    """A short fine-tune (Adam, 3e-3, batches of 64) of a pruned model on training rows; the masks keep
    pruned weights at zero."""
    import numpy as np
    import torch

    from trainpipe.data.tabular import encode_labels

    torch.manual_seed(seed)
    xt = torch.from_numpy(np.ascontiguousarray(x))
    if task == "classification":
        yt = torch.from_numpy(encode_labels(y_raw, classes or None)[1])
        loss_fn: Any = torch.nn.CrossEntropyLoss()
    else:
        y = np.asarray(y_raw, dtype=np.float32)
        scale = float(y.std()) or 1.0
        yt = torch.from_numpy(y)

        def loss_fn(pred: Any, target: Any) -> Any:
            return torch.mean(((pred.reshape(-1) - target) / scale) ** 2)

    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=3e-3)
    module.train()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            loss_fn(module(xt[idx]), yt[idx]).backward()
            opt.step()
    module.eval()


def _calibration_rows(config: OptimizeModelConfig, model: Any, x_train: Any) -> Any:
    import numpy as np

    if config.calibration_data:
        from trainpipe.data.tabular import read_table

        frame = read_table(config.calibration_data, "calibration_data")
        missing = [c for c in model.feature_columns if c not in frame.columns]
        if missing:
            raise InputError(f"calibration_data: feature columns missing: {', '.join(missing[:10])}")
        x = frame[model.feature_columns].to_numpy(dtype=np.float32)
        field = "calibration_data"
    else:
        x, field = x_train, "data"
    if len(x) == 0:
        raise InputError(
            f"{field}: no rows to calibrate int8_static on"
            + ("" if config.calibration_data else " (the split left no training rows)")
        )
    if len(x) > config.calibration_rows:
        x = x[np.sort(np.random.default_rng(config.seed).choice(len(x), config.calibration_rows, replace=False))]
    return np.ascontiguousarray(x)


def _variants(config: OptimizeModelConfig, model: Any) -> tuple[set[str], dict[str, str]]:
    """The variants to make, and the default ones this model does not allow with why. A variant the
    settings name is made or fails the step; a default one that cannot apply is skipped."""
    if config.variants is not None:
        return set(config.variants), {}
    wants, skipped = set(VARIANTS), {}
    if not prunable(model.module):
        wants.discard("pruned")
        skipped["pruned"] = "the model has no Linear or Conv layer besides its last one to prune"
    return wants, skipped


def _make(
    config: OptimizeModelConfig,
    model: Any,
    measure: _Measure,
    wants: set[str],
    calibration: Any,
    rows: tuple[Any, Any, Any, Any],
    work: Path,
) -> tuple[list[Variant], dict[str, Path], str]:
    """The reference and every wanted variant, measured on the held-out rows (``rows``: held-out
    features and labels, training features and labels): ``(variants, their files, the exporter)``.

    Raises:
        InputError: ONNX cannot export the model, or its outputs differ from torch's beyond ``onnx_atol``.
    """
    import numpy as np

    x_test, y_raw, x_train, y_train = rows
    eager = torch_predict(model.module)
    torch_out = eager(x_test)
    fp32 = measure("fp32", torch_out, eager, Path(config.model) / MODEL_FILE, None)
    variants, files = [fp32], {}
    exporter = export_onnx(model.module, x_test[:2], work / "onnx.onnx")
    session = ort_session(work / "onnx.onnx", config.threads)
    onnx_out = ort_predict(session)(x_test)
    diff = float(np.max(np.abs(onnx_out.reshape(torch_out.shape) - torch_out))) if len(x_test) else 0.0
    if not diff <= config.onnx_atol:
        raise InputError(
            f"model: its ONNX export ({exporter}) differs from torch by {diff:.3g} on the held-out rows, "
            f"beyond onnx_atol {config.onnx_atol}"
        )
    if "onnx" in wants:
        variants.append(measure("onnx", onnx_out, ort_predict(session), work / "onnx.onnx", fp32, max_abs_diff=diff))
        files["onnx"] = work / "onnx.onnx"
    for name, mode in (("int8_dynamic", "dynamic"), ("int8_static", "static")):
        if name in wants:
            quantize(work / "onnx.onnx", work / f"{name}.onnx", mode, calibration)
            predict = ort_predict(ort_session(work / f"{name}.onnx", config.threads))
            variants.append(measure(name, predict(x_test), predict, work / f"{name}.onnx", fp32))
            files[name] = work / f"{name}.onnx"
    if "pruned" in wants:
        variants.append(_pruned(config, model, measure.metric, fp32, x_test, y_raw, x_train, y_train, work, measure))
        files["pruned"] = work / "pruned.onnx"
    return variants, files, exporter


def _pruned(
    config: OptimizeModelConfig,
    model: Any,
    metric: str,
    fp32: Variant,
    x_test: Any,
    y_raw: Any,
    x_train: Any,
    y_train: Any,
    work: Path,
    figures: Callable[..., Variant],
) -> Variant:
    """Prune a copy, fine-tune it when the metric dropped beyond the gate, fold the masks in, export and measure."""
    import copy

    from torch.nn.utils import prune as tprune

    module = copy.deepcopy(model.module)
    params = prune(module, config.sparsity, config.pruning)
    predict = torch_predict(module)
    tuned = 0
    before = task_metrics(model.task, model.classes, y_raw, predict(x_test))[metric]
    if _drop(metric, fp32.metric, before) > config.max_metric_drop and config.fine_tune_epochs and len(x_train):
        fine_tune(module, model.task, model.classes, x_train, y_train, config.fine_tune_epochs, config.seed)
        tuned = config.fine_tune_epochs
    for m, name in params:
        tprune.remove(m, name)
    share = zero_share(params)
    export_onnx(module, x_test[:2], work / "pruned.onnx")
    s = ort_session(work / "pruned.onnx", config.threads)
    return figures(
        "pruned",
        ort_predict(s)(x_test),
        ort_predict(s),
        work / "pruned.onnx",
        fp32,
        sparsity=round(share, 4),
        fine_tuned_epochs=tuned,
        metric_before_fine_tune=before if tuned else None,
    )
