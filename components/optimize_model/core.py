"""optimize_model: the work. torch, onnx, onnxruntime and scikit-learn are imported inside the functions.

Every variant is measured in the same run, on the same held-out rows and the same CPU, against the
fp32 model in torch eager: the metric the gate compares, the file size, p50/p99 latency at batch 1
and throughput at batch 256. Only a variant within ``max_metric_drop`` of fp32 can be handed on.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import html
import io
import json
import logging
import math
import platform
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.optimize_model.spec import (
    DEFAULT_METRIC,
    LOWER_IS_BETTER,
    METRICS,
    NAME,
    ONNX_FORMAT,
    REPORT_FILE,
    VARIANTS,
    OptimizeModelConfig,
    OptimizeModelResult,
    Variant,
)
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json, atomic_write_text, file_digest
from trainpipe.contract.lineage import Lineage, OptimizationLineage
from trainpipe.contract.runtime import Runtime
from trainpipe.layout import MODEL_FILE, MODEL_META, ONNX_FILE, OPTIMIZATION_FILE, OPTIMIZED_MODEL_DIR
from trainpipe.serving.package import load_artifact
from trainpipe.splits import split_rows

#: Training rows read at most (the first ones of the training side): calibration and fine-tuning.
TRAINING_ROWS = 100_000
THROUGHPUT_BATCH = 256
INPUT_NAME = "features"
#: How long the batch-256 timing runs per variant (at least 5 batches).
THROUGHPUT_SECONDS = 0.3


# --- measuring --------------------------------------------------------------------------------------


def task_metrics(task: str, classes: list[Any], y_raw: Any, raw: Any) -> dict[str, float]:
    """The task's metrics of raw outputs (logits or values) against the raw labels."""
    import numpy as np
    from sklearn import metrics as skm

    from trainpipe.tabular import encode_labels

    if task == "classification":
        _, y = encode_labels(y_raw, classes or None)
        pred = np.asarray(raw).reshape(len(y), -1).argmax(axis=1)
        return {
            "accuracy": float(skm.accuracy_score(y, pred)),
            "f1_macro": float(skm.f1_score(y, pred, average="macro", zero_division=0)),
        }
    y, pred = np.asarray(y_raw, dtype=np.float64), np.asarray(raw, dtype=np.float64).reshape(len(y_raw))
    return {
        "r2": float(skm.r2_score(y, pred)),
        "rmse": float(math.sqrt(skm.mean_squared_error(y, pred))),
        "mae": float(skm.mean_absolute_error(y, pred)),
    }


def timings(predict: Callable[[Any], Any], x: Any, runs: int) -> tuple[float, float, float]:
    """``(p50 ms, p99 ms)`` of ``runs`` single-row calls and rows a second at batch 256 on ``x``."""
    import numpy as np

    rows = [np.ascontiguousarray(x[i % len(x) : i % len(x) + 1]) for i in range(min(runs, len(x)))]
    for r in rows[:10]:
        predict(r)
    times = []
    for i in range(runs):
        r = rows[i % len(rows)]
        t = time.perf_counter()
        predict(r)
        times.append(time.perf_counter() - t)
    batch = np.ascontiguousarray(np.resize(x, (THROUGHPUT_BATCH, x.shape[1])))
    predict(batch)
    n, start = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - start < THROUGHPUT_SECONDS:
        predict(batch)
        n += 1
    elapsed = time.perf_counter() - start
    p50, p99 = np.percentile(np.asarray(times) * 1000.0, [50, 99])
    return float(p50), float(p99), n * THROUGHPUT_BATCH / elapsed


def torch_predict(module: Any) -> Callable[[Any], Any]:
    import torch

    def run(x: Any) -> Any:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).float().numpy()

    return run


def ort_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime session with every graph optimization, on ``threads`` intra-op threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_predict(session: Any) -> Callable[[Any], Any]:
    name = session.get_inputs()[0].name

    def run(x: Any) -> Any:
        return session.run(None, {name: x})[0]

    return run


def gz_size(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), compresslevel=6))


# --- export, quantization, pruning -------------------------------------------------------------------


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

    from trainpipe.tabular import encode_labels

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


# --- the component ----------------------------------------------------------------------------------


def _drop(metric: str, reference: float, value: float) -> float:
    """How much worse ``value`` is than ``reference`` (positive: worse)."""
    return (value - reference) if metric in LOWER_IS_BETTER else (reference - value)


def _calibration_rows(config: OptimizeModelConfig, model: Any, x_train: Any) -> Any:
    import numpy as np

    if config.calibration_data:
        from trainpipe.tabular import read_table

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


def _select(variants: list[Variant], how: str) -> Variant | None:
    accepted = [v for v in variants if v.accepted and v.name != "fp32"]
    if not accepted:
        return None
    key: dict[str, Callable[[Variant], float]] = {
        "throughput": lambda v: -v.throughput_rows_s,
        "latency": lambda v: v.latency_p50_ms,
        "size": lambda v: v.size_bytes,
    }
    return min(accepted, key=key[how])


def optimize_model(
    config: OptimizeModelConfig, lineage: Lineage, runtime: Runtime | None = None
) -> OptimizeModelResult:
    """Make the CPU variants of a trained model, measure each on the held-out rows and hand on the best accepted one.

    Args:
        config: Settings and paths.
        lineage: The model's lineage; ``optimization`` is added.
        runtime: The platform's settings: the team packages whose model code may be imported.

    Returns:
        Every variant's figures and the selected one (written to ``model/`` as ``model.onnx`` and
        ``model.json``, which MLflow + onnxruntime load without trainpipe), or why none was accepted.

    Raises:
        InputError: the model is not a PyTorch model or ONNX cannot export it (naming the operator),
            its ONNX outputs differ from torch's beyond ``onnx_atol``, the sparsity is impossible for
            a layer, the calibration set is empty, or the data does not fit the model.
    """
    import torch

    runtime = runtime or Runtime()
    model = load_artifact(config.model, runtime)
    framework = model.meta.get("framework", "torch")
    if framework != "torch":
        raise InputError(f"model: optimize_model exports PyTorch models to ONNX; this one was trained with {framework}")
    metric = config.metric or DEFAULT_METRIC[model.task]
    if metric not in METRICS[model.task]:
        raise InputError(f"metric: {metric} is not a {model.task} metric (one of {', '.join(METRICS[model.task])})")
    wants, skipped = _variants(config, model)
    need_train = (
        "int8_static" in wants and not config.calibration_data or ("pruned" in wants and config.fine_tune_epochs)
    )
    x_test, y_raw, x_train, y_train, _ = split_rows(
        config.data, model, config.label_column, TRAINING_ROWS if need_train else 0
    )
    calibration = _calibration_rows(config, model, x_train) if "int8_static" in wants else None
    if "pruned" in wants and config.pruning == "structured":  # an impossible sparsity is refused before any export
        import copy

        prune(copy.deepcopy(model.module), config.sparsity, config.pruning)
    torch.set_num_threads(config.threads)
    measure = _Measure(config, model, metric, x_test, y_raw)
    weights = Path(config.model) / MODEL_FILE
    out = Path(config.output_dir)
    with tempfile.TemporaryDirectory(prefix="trainpipe-optimize-") as tmp:
        rows = (x_test, y_raw, x_train, y_train)
        variants, files, exporter = _make(config, model, measure, wants, calibration, rows, Path(tmp))
        chosen = _select(variants, config.select)
        sha = None
        if chosen is not None:
            sha = file_digest(files[chosen.name], "sha256")
            _write_model(out / OPTIMIZED_MODEL_DIR, files[chosen.name], model, chosen, x_test, exporter, sha, weights)
        else:
            shutil.rmtree(out / OPTIMIZED_MODEL_DIR, ignore_errors=True)
    import onnxruntime

    result = OptimizeModelResult(
        task=model.task,
        metric=metric,
        max_metric_drop=config.max_metric_drop,
        n_test=len(x_test),
        calibration_rows=0 if calibration is None else len(calibration),
        threads=config.threads,
        cpu=_cpu(),
        onnxruntime=onnxruntime.__version__,
        variants=variants,
        selected=chosen.name if chosen else None,
        reason=_reason(chosen, variants, metric, config),
        skipped=skipped,
        model_sha256=sha,
    )
    atomic_write_text(out / REPORT_FILE, report(result))
    atomic_write_json(out / OPTIMIZATION_FILE, result.model_dump(mode="json", exclude={"lineage"}))
    fp32 = variants[0]
    result.lineage = Lineage.of(lineage).with_(
        optimization=OptimizationLineage(
            variant=result.selected,
            metric=metric,
            fp32_metric=round(fp32.metric, 6),
            metric_value=round(chosen.metric, 6) if chosen else None,
            speedup_b256=round(chosen.speedup_b256, 3) if chosen else None,
            size_ratio=round(chosen.size_ratio, 4) if chosen else None,
            onnx_sha256=sha,
            exporter=exporter,
        )
    )
    return result


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


class _Measure:
    """A variant's figures against the reference (fp32 torch eager), on the held-out rows and this CPU."""

    def __init__(self, config: OptimizeModelConfig, model: Any, metric: str, x_test: Any, y_raw: Any) -> None:
        import numpy as np

        self.config, self.model, self.metric, self.y_raw = config, model, metric, y_raw
        self.x_time = np.ascontiguousarray(x_test[: max(config.latency_runs, 1)])

    def __call__(
        self, name: str, raw: Any, predict: Callable[[Any], Any], path: Path, reference: Variant | None, **extra: Any
    ) -> Variant:
        config, metric, ref = self.config, self.metric, reference
        scores = task_metrics(self.model.task, self.model.classes, self.y_raw, raw)
        p50, p99, rps = timings(predict, self.x_time, config.latency_runs)
        size = path.stat().st_size
        drop = 0.0 if ref is None else _drop(metric, ref.metric, scores[metric])
        ok = drop <= config.max_metric_drop + 1e-12
        if ref is None:
            reason = "the reference (torch eager)"
        else:
            verdict = "within" if ok else "beyond"
            moved = f"{'drops' if drop > 0 else 'gains'} {abs(drop):.4f}"
            reason = f"{metric} {moved} ({verdict} max_metric_drop {config.max_metric_drop})"
        return Variant(
            name=name,
            metric=scores[metric],
            metric_drop=drop,
            metrics=scores,
            size_bytes=size,
            size_ratio=size / ref.size_bytes if ref else 1.0,
            compressed_bytes=gz_size(path),
            latency_p50_ms=p50,
            latency_p99_ms=p99,
            throughput_rows_s=rps,
            speedup_b1=(ref.latency_p50_ms / p50) if ref else 1.0,
            speedup_b256=(rps / ref.throughput_rows_s) if ref else 1.0,
            accepted=ok if ref else False,
            reason=reason,
            **extra,
        )


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


def _reason(chosen: Variant | None, variants: list[Variant], metric: str, config: OptimizeModelConfig) -> str:
    """Why this variant was handed on, or why none was."""
    if chosen is not None:
        how = {"throughput": "fastest at batch 256", "latency": "fastest at batch 1"}.get(config.select, "smallest")
        return f"{chosen.name}: the {how} of the variants within max_metric_drop {config.max_metric_drop}"
    if not variants[1:]:
        return "no variant made"
    worst = ", ".join(f"{v.name} drops {v.metric_drop:.4f}" for v in variants[1:])
    return f"every variant's {metric} drops beyond max_metric_drop {config.max_metric_drop} ({worst})"


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


def _cpu() -> str:
    """The CPU model and the cores this process may use (its cgroup's quota in a pod)."""
    from trainpipe.resources import usable_cpus

    name = platform.processor() or platform.machine()
    try:
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return f"{name} ({usable_cpus()} cores)"


def _write_model(
    dest: Path, onnx_path: Path, model: Any, chosen: Variant, x_test: Any, exporter: str, sha: str, weights: Path
) -> None:
    """The selected variant as a folder MLflow + onnxruntime load without trainpipe: ``model.onnx``,
    ``model.json`` (what it predicts, and its parent) and the input/output examples."""
    from importlib.metadata import version

    import numpy as np
    import onnxruntime
    import pandas as pd

    from trainpipe.serving import loader
    from trainpipe.serving.package import INPUT_EXAMPLE_FILE, write_examples

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(onnx_path, tmp / ONNX_FILE)
    meta = {
        "format": ONNX_FORMAT,
        "variant": chosen.name,
        "exporter": exporter,
        "input_name": INPUT_NAME,
        "task": model.task,
        "classes": model.classes,
        "feature_columns": model.feature_columns,
        "onnx_sha256": sha,
        "parent": {"builder": model.meta.get("builder"), "model_sha256": file_digest(weights, "sha256")},
        "requirements": [
            f"onnxruntime=={onnxruntime.__version__}",
            f"numpy=={version('numpy')}",
            f"pandas=={version('pandas')}",
        ],
    }
    (tmp / MODEL_META).write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
    # the parent's example: the training frame's rows with its column types (the signature declares them)
    parent_example = weights.parent / INPUT_EXAMPLE_FILE
    if parent_example.is_file():
        example_in = pd.read_json(parent_example, orient="split", dtype=False)[model.feature_columns]
    else:
        example_in = pd.DataFrame(np.ascontiguousarray(x_test[:5]), columns=model.feature_columns)
    rows = np.ascontiguousarray(example_in.to_numpy(dtype=np.float32))
    raw = ort_predict(ort_session(tmp / ONNX_FILE, 1))(rows)
    write_examples(tmp, example_in, loader.outputs_frame(raw, model.task, model.classes))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


# --- the report ---------------------------------------------------------------------------------------


def chart(result: OptimizeModelResult) -> str:
    """The metric against p50 latency at batch 1, one labelled point per variant (accepted green,
    rejected red, fp32 grey), as inline SVG."""
    w, h, pad = 560, 340, 56
    vs = result.variants
    xs = [v.latency_p50_ms for v in vs]
    ys = [v.metric for v in vs]
    x0, x1 = 0.0, max(xs) * 1.15 or 1.0
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or max(abs(hi), 1e-3) * 0.1
    y0, y1 = lo - span * 0.3, hi + span * 0.3

    def px(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (w - 2 * pad)

    def py(y: float) -> float:
        return h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" role="img" '
        f'aria-label="{html.escape(result.metric)} against p50 latency at batch 1">',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
        f'<text x="{w / 2}" y="{h - 14}" text-anchor="middle" font-size="12">p50 latency at batch 1 (ms)</text>',
        f'<text x="14" y="{h / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 '
        f'{h / 2})">{html.escape(result.metric)}</text>',
    ]
    for t in range(5):
        xv, yv = x0 + (x1 - x0) * t / 4, y0 + (y1 - y0) * t / 4
        parts.append(f'<text x="{px(xv):.1f}" y="{h - pad + 16}" text-anchor="middle" font-size="10">{xv:.3g}</text>')
        parts.append(f'<text x="{pad - 6}" y="{py(yv) + 3:.1f}" text-anchor="end" font-size="10">{yv:.4g}</text>')
    for v in vs:
        color = "#888" if v.name == "fp32" else ("#2a7" if v.accepted else "#c33")
        parts.append(
            f'<circle class="point" data-variant="{html.escape(v.name)}" cx="{px(v.latency_p50_ms):.1f}" '
            f'cy="{py(v.metric):.1f}" r="6" '
            f'fill="{color}"><title>{html.escape(v.name)}</title></circle>'
        )
        parts.append(
            f'<text x="{px(v.latency_p50_ms) + 9:.1f}" y="{py(v.metric) + 4:.1f}" '
            f'font-size="11">{html.escape(v.name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def report(result: OptimizeModelResult) -> str:
    """One page: the decision, every variant's figures in a table, and the metric-latency chart."""
    head = (
        "<tr><th>variant</th><th>accepted</th><th>"
        + html.escape(result.metric)
        + "</th><th>drop</th><th>size (bytes)</th><th>size ratio</th>"
        "<th>gzipped</th><th>p50 ms (batch 1)</th><th>p99 ms</th><th>rows/s (batch 256)</th><th>speed-up "
        "b1</th><th>speed-up b256</th>"
        "<th>why</th></tr>"
    )
    rows = "".join(
        f"<tr data-variant='{html.escape(v.name)}'><th>{html.escape(v.name)}</th>"
        f"<td>{'—' if v.name == 'fp32' else 'yes' if v.accepted else 'no'}</td>"
        f"<td>{v.metric:.4f}</td><td>{v.metric_drop:+.4f}</td><td>{v.size_bytes}</td><td>{v.size_ratio:.3f}</td><td>{v.compressed_bytes}</td>"
        f"<td>{v.latency_p50_ms:.4f}</td><td>{v.latency_p99_ms:.4f}</td><td>{v.throughput_rows_s:.0f}</td><td>{v.speedup_b1:.2f}</td>"
        f"<td>{v.speedup_b256:.2f}</td><td>{html.escape(v.reason)}</td></tr>"
        for v in result.variants
    )
    verdict = f"selected {html.escape(result.selected)}" if result.selected else "no variant accepted"
    skipped = "".join(f"<li>{html.escape(k)}: {html.escape(why)}</li>" for k, why in result.skipped.items())
    skipped = f"<h2>Not made</h2><ul id='skipped'>{skipped}</ul>" if skipped else ""
    svg = base64.b64encode(chart(result).encode("utf-8")).decode("ascii")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe optimization</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>Optimization ({html.escape(result.task)}): {verdict}</h1><p id='reason'>{html.escape(result.reason)}</p>"
        f"<p>{result.n_test} held-out rows; {html.escape(result.cpu)}; {result.threads} thread(s); ONNX Runtime "
        f"{html.escape(result.onnxruntime)}; "
        f"calibrated on {result.calibration_rows} rows.</p>"
        f"<table id='variants'>{head}{rows}</table>{skipped}<h2>{html.escape(result.metric)} against latency</h2>"
        f"<figure><img alt='{html.escape(result.metric)} against p50 latency' src='data:image/svg+xml;base64,{svg}'>"
        "<figcaption>one point per variant: grey fp32 (torch eager), green accepted, red beyond "
        "max_metric_drop</figcaption></figure></body></html>\n"
    )


__all__ = ["NAME", "export_onnx", "optimize_model", "prune", "quantize", "task_metrics", "timings"]
