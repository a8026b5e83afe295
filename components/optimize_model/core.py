"""optimize_model: the work. torch, onnx, onnxruntime and scikit-learn are imported inside the functions.

This module runs the step from end to end; each job has its module beside it: ``variants`` (export, quantize,
prune), ``measurement`` (metric, size, latency, throughput), ``choice`` (the variant handed on, the model
written, the report).

Every variant is measured in the same run, on the same held-out rows and the same CPU, against the
fp32 model in torch eager: the metric the gate compares, the file size, p50/p99 latency at batch 1
and throughput at batch 256. Only a variant within ``max_metric_drop`` of fp32 can be handed on.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trainpipe.components.optimize_model.choice import _reason, _select, _write_model, report
from trainpipe.components.optimize_model.measurement import _cpu, _Measure
from trainpipe.components.optimize_model.spec import (
    DEFAULT_METRIC,
    METRICS,
    NAME,
    REPORT_FILE,
    OptimizeModelConfig,
    OptimizeModelResult,
)
from trainpipe.components.optimize_model.variants import TRAINING_ROWS, _calibration_rows, _make, _variants, prune
from trainpipe.contract.errors import InputError
from trainpipe.contract.io import atomic_write_json, atomic_write_text, file_digest
from trainpipe.contract.layout import MODEL_FILE, OPTIMIZATION_FILE, OPTIMIZED_MODEL_DIR
from trainpipe.contract.lineage import Lineage, OptimizationLineage
from trainpipe.contract.runtime import Runtime
from trainpipe.data.splits import split_rows
from trainpipe.services.serving.package import load_artifact


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads at ``threads`` while the variants are made and measured, and as they were
    afterwards: a process that runs other steps after this one (Airflow's ``dag.test()``, a caller of the core)
    keeps its own thread count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    weights = Path(config.model) / MODEL_FILE
    out = Path(config.output_dir)
    with _torch_threads(config.threads):
        measure = _Measure(config, model, metric, x_test, y_raw)
        with tempfile.TemporaryDirectory(prefix="trainpipe-optimize-") as tmp:
            rows = (x_test, y_raw, x_train, y_train)
            variants, files, exporter = _make(config, model, measure, wants, calibration, rows, Path(tmp))
            chosen = _select(variants, config.select)
            sha = None
            if chosen is not None:
                sha = file_digest(files[chosen.name], "sha256")
                _write_model(
                    out / OPTIMIZED_MODEL_DIR, files[chosen.name], model, chosen, x_test, exporter, sha, weights
                )
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


__all__ = ["NAME", "optimize_model"]
