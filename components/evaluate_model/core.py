"""evaluate_model: the work. torch and scikit-learn are imported inside the functions."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from trainpipe.components.evaluate_model.spec import (
    DECISION_FILE,
    METRICS_FILE,
    NAME,
    REPORT_FILE,
    EvaluateModelConfig,
    EvaluateModelResult,
    GateDecision,
)
from trainpipe.contract.errors import GateFailed
from trainpipe.contract.io import atomic_write_json, atomic_write_text


def decide(metrics: dict[str, float], thresholds: dict[str, float]) -> GateDecision:
    """The gate: every threshold met, fail closed on a missing or NaN metric.

    Returns:
        The decision with one reason per threshold, passed or not.
    """
    reasons = []
    passed = True
    for name, minimum in sorted(thresholds.items()):
        value = metrics.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            passed = False
            reasons.append(f"{name} is missing or NaN: fails closed")
        elif value < minimum:
            passed = False
            reasons.append(f"{name} {value:.4f} < threshold {minimum:.4f}")
        else:
            reasons.append(f"{name} {value:.4f} >= threshold {minimum:.4f}")
    if not thresholds:
        reasons.append("no thresholds configured")
    reasons.append("no champion comparison (absolute thresholds only)")
    return GateDecision(passed=passed, reasons=reasons, thresholds=thresholds, metrics=metrics)


def _report(result: EvaluateModelResult) -> str:
    m = "".join(f"<tr><th>{html.escape(k)}</th><td>{v:.4f}</td></tr>" for k, v in result.metrics.items())
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in result.classes)
    cm = "".join(
        f"<tr><th>{html.escape(str(c))}</th>" + "".join(f"<td>{n}</td>" for n in row) + "</tr>"
        for c, row in zip(result.classes, result.confusion_matrix)
    )
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.decision.reasons)
    verdict = "passed" if result.decision.passed else "NOT passed"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe evaluation</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px}</style></head><body>"
        f"<h1>Evaluation: gate {verdict}</h1><ul>{reasons}</ul><h2>Metrics ({result.n_test} held-out rows)</h2>"
        f"<table>{m}</table><h2>Confusion matrix (rows: true, columns: predicted)</h2>"
        f"<table><tr><th></th>{head}</tr>{cm}</table></body></html>\n"
    )


def evaluate_model(config: EvaluateModelConfig, lineage: dict[str, Any]) -> EvaluateModelResult:
    """Score the model on the held-out split of its own snapshot and decide the gate.

    Args:
        config: Settings and paths.
        lineage: The lineage so far (model and data must share one snapshot); ``evaluation`` is added.

    Returns:
        Metrics, confusion matrix and the gate decision (also written as ``decision.json``).

    Raises:
        InputError: the data does not fit the model (columns, unseen labels).
        GateFailed: only with ``fail_on_gate``, after the decision is written.
    """
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    from trainpipe.components.train_model.models import load_model, predict_proba
    from trainpipe.tabular import encode_labels, features_and_label, read_table, split_indices

    model, meta = load_model(config.model)
    df = read_table(config.data, "data")
    _, x, y_raw = features_and_label(df, config.label_column, meta["feature_columns"])
    _, test_idx = split_indices(len(df), meta["split"]["test_fraction"], meta["split"]["seed"])
    classes, y = encode_labels(y_raw[test_idx], meta["classes"])
    pred = predict_proba(model, meta, x[test_idx]).argmax(axis=1)
    p, r, f1, _ = precision_recall_fscore_support(y, pred, average="macro", zero_division=0)
    metrics = {
        "accuracy": float(accuracy_score(y, pred)),
        "f1_macro": float(f1),
        "precision_macro": float(p),
        "recall_macro": float(r),
    }
    cm = confusion_matrix(y, pred, labels=list(range(len(classes)))).tolist()
    decision = decide(metrics, config.thresholds)
    result = EvaluateModelResult(metrics=metrics, confusion_matrix=cm, classes=classes, n_test=len(test_idx), decision=decision)
    out = Path(config.output_dir)
    atomic_write_json(out / METRICS_FILE, {"metrics": metrics, "confusion_matrix": cm, "classes": classes})
    atomic_write_text(out / REPORT_FILE, _report(result))
    atomic_write_json(out / DECISION_FILE, decision.model_dump(mode="json"))
    lineage = dict(lineage)
    lineage["evaluation"] = {"metrics": {k: round(v, 6) for k, v in metrics.items()}, "passed": decision.passed, "n_test": len(test_idx)}
    result.lineage = lineage
    if config.fail_on_gate and not decision.passed:
        raise GateFailed("gate not passed: " + "; ".join(r for r in decision.reasons if "<" in r or "NaN" in r))
    return result


__all__ = ["NAME", "decide", "evaluate_model"]
