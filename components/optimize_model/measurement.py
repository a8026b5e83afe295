"""optimize_model's measurement: the metric, the file size, the latency and the throughput of a model on the
same held-out rows and the same CPU. torch, onnxruntime and scikit-learn are imported inside the functions."""

from __future__ import annotations

import gzip
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainpipe.components.optimize_model.spec import (
    LOWER_IS_BETTER,
    OptimizeModelConfig,
    Variant,
)

THROUGHPUT_BATCH = 256
#: How long the batch-256 timing runs per variant (at least 5 batches).
THROUGHPUT_SECONDS = 0.3


def task_metrics(task: str, classes: list[Any], y_raw: Any, raw: Any) -> dict[str, float]:
    """The task's metrics of raw outputs (logits or values) against the raw labels."""
    import numpy as np
    from sklearn import metrics as skm

    from trainpipe.data.tabular import encode_labels

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


def _drop(metric: str, reference: float, value: float) -> float:
    """How much worse ``value`` is than ``reference`` (positive: worse)."""
    return (value - reference) if metric in LOWER_IS_BETTER else (reference - value)


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


def _cpu() -> str:
    """The CPU model and the cores this process may use (its cgroup's quota in a pod)."""
    from trainpipe.contract.resources import usable_cpus

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
