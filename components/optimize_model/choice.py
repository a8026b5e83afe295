"""optimize_model's choice: the variant handed on (within ``max_metric_drop`` of fp32, by the ``select`` rule),
why, the accepted model written for register_model, and the report."""

from __future__ import annotations

import base64
import html
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainpipe.components.optimize_model.measurement import ort_predict, ort_session
from trainpipe.components.optimize_model.spec import (
    ONNX_FORMAT,
    OptimizeModelConfig,
    OptimizeModelResult,
    Variant,
)
from trainpipe.components.optimize_model.variants import INPUT_NAME
from trainpipe.contract.io import file_digest
from trainpipe.contract.layout import MODEL_META, ONNX_FILE


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


def _reason(chosen: Variant | None, variants: list[Variant], metric: str, config: OptimizeModelConfig) -> str:
    """Why this variant was handed on, or why none was."""
    if chosen is not None:
        how = {"throughput": "fastest at batch 256", "latency": "fastest at batch 1"}.get(config.select, "smallest")
        return f"{chosen.name}: the {how} of the variants within max_metric_drop {config.max_metric_drop}"
    if not variants[1:]:
        return "no variant made"
    worst = ", ".join(f"{v.name} drops {v.metric_drop:.4f}" for v in variants[1:])
    return f"every variant's {metric} drops beyond max_metric_drop {config.max_metric_drop} ({worst})"


def _write_model(
    dest: Path, onnx_path: Path, model: Any, chosen: Variant, x_test: Any, exporter: str, sha: str, weights: Path
) -> None:
    """The selected variant as a folder MLflow + onnxruntime load without trainpipe: ``model.onnx``,
    ``model.json`` (what it predicts, and its parent) and the input/output examples."""
    from importlib.metadata import version

    import numpy as np
    import onnxruntime
    import pandas as pd

    from trainpipe.services.serving import loader
    from trainpipe.services.serving.package import INPUT_EXAMPLE_FILE, write_examples

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
