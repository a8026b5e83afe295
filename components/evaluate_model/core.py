"""evaluate_model: the work. torch, scikit-learn, matplotlib and mlflow are imported inside the functions, each
where its part of the work needs it: torch to load and run a model, MLflow to ask for the champion (and what
comparing with one takes, only once there is one), matplotlib's ``Figure`` and Agg canvas for the charts (not
pyplot)."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any

from trainpipe.components.evaluate_model.spec import (
    LOWER_IS_BETTER,
    METRICS_FILE,
    NAME,
    REPORT_FILE,
    EvaluateModelConfig,
    EvaluateModelResult,
    GateDecision,
)
from trainpipe.contract.errors import GateFailed, InputError
from trainpipe.contract.io import atomic_write_json, atomic_write_text
from trainpipe.contract.layout import DECISION_FILE
from trainpipe.contract.lineage import EvaluationLineage, Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.data.scoring import classification_metrics, regression_metrics
from trainpipe.data.splits import held_out_rows
from trainpipe.services import gate, registry
from trainpipe.services.serving.package import load_artifact


def decide(
    metrics: dict[str, float],
    thresholds: dict[str, float],
    champion: dict[str, Any] | None = None,
    min_improvement: dict[str, float] | None = None,
    max_regression: dict[str, float] | None = None,
    lower_is_better: frozenset[str] = LOWER_IS_BETTER,
    alias: str = registry.DEFAULT_ALIAS,
    tie_tolerance: float = 0.0,
) -> GateDecision:
    """The gate: absolute thresholds, then the comparison with the champion.

    Fails closed: a missing or NaN metric (the model's or the champion's, for a
    compared metric) fails the gate. Every threshold and comparison gives a reason,
    passed or not. The model beats the champion only when it passes and is strictly better
    (:func:`trainpipe.services.gate.compare`): a tie passes the gate but keeps the champion.

    Args:
        metrics: The model's metrics on the held-out split.
        thresholds: Minimum (or maximum, for lower-is-better metrics) per metric.
        champion: ``{"version", "run_id", "metrics"}`` of the current champion scored on the
            same split, or None when there is none (or it could not be compared: then
            ``champion["skipped"]`` says why).
        min_improvement: Per metric, how much better than the champion the model must be.
        max_regression: Per metric, how much worse than the champion it may be.
        lower_is_better: The metrics that are better when lower.
        alias: The serving alias whose holder ``champion`` is: the reasons name it.
        tie_tolerance: A compared metric is better only when better by more than this.
    """
    reasons: list[str] = []
    failures: list[str] = []
    rules = gate.Rules(dict(min_improvement or {}), dict(max_regression or {}), tie_tolerance, lower_is_better)
    better = False

    def check(ok: bool, reason: str) -> None:
        reasons.append(reason)
        if not ok:
            failures.append(reason)

    for name, bound in sorted(thresholds.items()):
        value = metrics.get(name)
        if value is None or gate.bad(value):
            check(False, f"{name} is missing or NaN: fails closed")
        elif name in lower_is_better:
            ok = value <= bound
            check(ok, f"{name} {value:.4f} {'<=' if ok else '>'} maximum {bound:.4f}")
        else:
            ok = value >= bound
            check(ok, f"{name} {value:.4f} {'>=' if ok else '<'} threshold {bound:.4f}")
    if not thresholds:
        reasons.append("no thresholds configured")
    compared = False
    if champion is None:
        reasons.append(f"no {alias} yet: decided by the absolute thresholds alone")
    elif champion.get("skipped"):
        reasons.append(
            f"{alias} version {champion.get('version')} not compared ({champion['skipped']}): decided by the absolute "
            "thresholds alone"
        )
    else:
        compared = True
        found = gate.compare(metrics, champion["metrics"], f"{alias} version {champion['version']}", rules)
        reasons += found.reasons
        failures += found.failures
        better = found.better
    passed = not failures
    return GateDecision(
        passed=passed,
        reasons=reasons,
        failures=failures,
        thresholds=thresholds,
        metrics=metrics,
        champion=champion,
        compared_with_champion=compared,
        beats_champion=passed and compared and better,
        rules=rules.to_dict(),
    )


def regression_charts(y: Any, pred: Any) -> list[tuple[str, str]]:
    """Predicted against actual, residuals against predicted, and the residuals' histogram, as PNG."""
    import numpy as np

    y, pred = np.asarray(y, dtype=float), np.asarray(pred, dtype=float)
    resid = y - pred
    out = []
    fig, ax = _subplots((5, 4.5))
    ax.scatter(y, pred, s=6, alpha=0.6)
    lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], linewidth=0.8, color="grey")
    ax.set_xlabel("actual")
    ax.set_ylabel("predicted")
    out.append(("Predicted against actual", _png(fig)))
    fig, ax = _subplots((5, 4))
    ax.scatter(pred, resid, s=6, alpha=0.6)
    ax.axhline(0.0, linewidth=0.8, color="grey")
    ax.set_xlabel("predicted")
    ax.set_ylabel("residual (actual - predicted)")
    out.append(("Residuals against predicted", _png(fig)))
    fig, ax = _subplots((5, 3.5))
    ax.hist(resid, bins=30)
    ax.set_xlabel("residual")
    ax.set_ylabel("rows")
    out.append(("Residuals", _png(fig)))
    return out


def _subplots(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its axes drawn by the Agg canvas, without pyplot (its import and figure registry); the PNG
    is the one ``plt.subplots`` would give."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def charts(y: Any, proba: Any, classes: list[Any], cm: list[list[int]]) -> list[tuple[str, str]]:
    """Confusion matrix, ROC and precision-recall curves (one-vs-rest per class), as PNG."""
    import numpy as np
    from sklearn import metrics as skm

    out = []
    fig, ax = _subplots((5, 4.5))
    im = ax.imshow(np.asarray(cm), cmap="Blues")
    ax.set_xticks(range(len(classes)), [str(c) for c in classes], rotation=45)
    ax.set_yticks(range(len(classes)), [str(c) for c in classes])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i, row in enumerate(cm):
        for j, n in enumerate(row):
            if n:
                ax.text(j, i, str(n), ha="center", va="center", fontsize=7)
    fig.colorbar(im)
    out.append(("Confusion matrix", _png(fig)))
    onehot = np.eye(len(classes))[y]
    for title, curve in (("ROC curves", skm.roc_curve), ("Precision-recall curves", skm.precision_recall_curve)):
        fig, ax = _subplots((5, 4))
        for k, c in enumerate(classes):
            if onehot[:, k].any():
                a, b, _ = curve(onehot[:, k], proba[:, k])
                ax.plot(a, b, linewidth=0.8, label=str(c)) if curve is skm.roc_curve else ax.plot(
                    b, a, linewidth=0.8, label=str(c)
                )
        ax.set_xlabel("false positive rate" if curve is skm.roc_curve else "recall")
        ax.set_ylabel("true positive rate" if curve is skm.roc_curve else "precision")
        ax.legend(fontsize="x-small", ncol=2)
        out.append((title, _png(fig)))
    return out


def _report(
    result: EvaluateModelResult, images: list[tuple[str, str]], trained: tuple[float, str | None] | None = None
) -> str:
    """The HTML report; ``trained``: what training this model cost (its lineage), shown beside the verdict."""

    def fmt(v: float) -> str:
        return "NaN" if math.isnan(v) else f"{v:.4f}"

    m = "".join(f"<tr><th>{html.escape(k)}</th><td>{fmt(v)}</td></tr>" for k, v in result.metrics.items())
    pc = "".join(
        f"<tr><th>{html.escape(c)}</th>"
        + "".join(f"<td>{v[k]:.4g}</td>" for k in ("precision", "recall", "f1", "support"))
        + "</tr>"
        for c, v in result.per_class.items()
    )
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.decision.reasons)
    verdict = "passed" if result.decision.passed else "NOT passed"
    imgs = "".join(
        f'<figure><img alt="{html.escape(t)}" '
        f'src="data:image/png;base64,{b}"><figcaption>{html.escape(t)}</figcaption></figure>'
        for t, b in images
    )
    if result.task == "classification":
        detail = (
            f"<h2>Per class</h2><table id='per-class'><tr><th>class</th><th>precision</th><th>recall</th>"
            f"<th>f1</th><th>support</th></tr>{pc}</table>"
        )
    else:
        detail = (
            "<h2>Residuals</h2><table id='residuals'>"
            + "".join(f"<tr><th>{html.escape(k)}</th><td>{fmt(v)}</td></tr>" for k, v in result.residuals.items())
            + "</table>"
        )
    cost = (
        f"<p id='cost'>Training this model cost {trained[0]:.4f} {html.escape(trained[1] or '')} (its hardware "
        "profile's prices, every attempt counted).</p>"
        if trained is not None
        else ""
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe evaluation</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px "
        "8px;text-align:left}figure{display:inline-block}</style></head><body>"
        f"<h1>Evaluation ({html.escape(result.task)}): gate {verdict}</h1><ul id='reasons'>{reasons}</ul>{cost}"
        "<h2>Metrics "
        f"({result.n_test} held-out rows)</h2>"
        f"<table id='metrics'>{m}</table>{detail}<h2>Charts</h2>{imgs}</body></html>\n"
    )


def score(model: Any, x: Any, y_raw: Any, config: EvaluateModelConfig) -> dict[str, Any]:
    """Every metric of ``model`` on ``(x, y_raw)``: the task's own and the team's metric functions."""
    import numpy as np

    from trainpipe.data.tabular import encode_labels

    if model.task == "classification":
        classes, y = encode_labels(y_raw, model.classes or None)
        proba = model.predict_proba(x)
        if proba.shape[1] != len(classes):
            raise InputError(f"model: it gives {proba.shape[1]} outputs for {len(classes)} classes")
        out = classification_metrics(y, proba, len(classes))
        out.update({"y": y, "proba": proba, "classes": classes})
        labels_true, labels_pred = (
            np.asarray(classes, dtype=object)[y],
            np.asarray(classes, dtype=object)[proba.argmax(axis=1)],
        )
    else:
        y = np.asarray(y_raw, dtype=np.float64)
        pred = np.asarray(model.predict_values(x), dtype=np.float64)
        if pred.ndim != 1:
            raise InputError(f"model: a regressor must give one value a row, it gives {pred.shape[1]}")
        out = {"metrics": regression_metrics(y, pred), "y": y, "pred": pred, "classes": []}
        labels_true, labels_pred = y, pred
    for name, ref in sorted(config.metric_functions.items()):
        out["metrics"][name] = _team_metric(name, ref, labels_true, labels_pred)
    return out


def _team_metric(name: str, ref: str, y_true: Any, y_pred: Any) -> float:
    from trainpipe.contract.imports import import_module

    module, _, func = ref.partition(":")
    try:
        fn = getattr(import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"metric_functions: {name}: cannot import {ref!r}: {exc}") from None
    try:
        value = float(fn(y_true, y_pred))
    except Exception as exc:
        raise InputError(
            f"metric_functions: {name}: {ref} raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
        ) from None
    return value


def champion_scores(
    config: EvaluateModelConfig, model: Any, x_test: Any, y_raw: Any, runtime: Runtime
) -> dict[str, Any] | None:
    """The current champion scored on the same held-out rows; None when there is none."""
    if not config.model_name:
        return None
    holder = registry.champion(config.tracking_uri, config.model_name, config.alias, runtime)
    if holder is None:
        return None
    info: dict[str, Any] = {"version": holder.number, "run_id": holder.run_id}
    champ, why = holder.model()
    if champ is None:
        return {**info, "skipped": why}
    if champ.task != model.task:
        return {**info, "skipped": f"it is a {champ.task} model"}
    if [str(c) for c in champ.classes] != [str(c) for c in model.classes]:
        return {**info, "skipped": "it predicts other classes than this model"}
    if champ.feature_columns != model.feature_columns:
        return {**info, "skipped": "it takes other feature columns than this model"}
    return {**info, "metrics": score(champ, x_test, y_raw, config)["metrics"]}


def evaluate_model(
    config: EvaluateModelConfig, lineage: Lineage, runtime: Runtime | None = None
) -> EvaluateModelResult:
    """Score the model on the held-out split of its own snapshot and decide the gate.

    Args:
        config: Settings and paths.
        lineage: The lineage so far (model and data must share one snapshot); ``evaluation`` is added.
        runtime: The platform's settings: the team packages whose model code may be imported, and
            the policy the tracking server is reached under.

    Returns:
        Metrics, charts and the gate decision (also written as ``decision.json``).

    Raises:
        InputError: the data does not fit the model (columns, unseen labels), or a rule names a
            metric the model's task does not have.
        ServiceUnavailable: the champion could not be read from MLflow.
        GateFailed: only with ``fail_on_gate``, after the decision is written.
    """
    import numpy as np

    runtime = runtime or Runtime()
    model = load_artifact(config.model, runtime)
    thresholds, min_improvement, max_regression = config.gate_rules(model.task)
    x_test, y_raw, _ = held_out_rows(config.data, model, config.label_column)
    scores = score(model, x_test, y_raw, config)
    metrics = scores["metrics"]
    champion = champion_scores(config, model, x_test, y_raw, runtime)
    lower = config.lower_better()
    decision = decide(
        metrics, thresholds, champion, min_improvement, max_regression, lower, config.alias, config.tie_tolerance
    ).model_copy(update={"model_name": config.model_name, "alias": config.alias})
    result = EvaluateModelResult(
        task=model.task,
        metrics=metrics,
        lower_is_better=sorted(m for m in metrics if m in lower),
        classes=scores["classes"],
        n_test=len(x_test),
        decision=decision,
    )
    if model.task == "classification":
        result.per_class = {str(c): v for c, v in zip(scores["classes"], scores["per_class"], strict=True)}
        result.confusion_matrix = scores["confusion_matrix"]
        result.roc_curve = scores["roc_curve"]
        images = charts(scores["y"], scores["proba"], scores["classes"], scores["confusion_matrix"])
    else:
        resid = scores["y"] - scores["pred"]
        result.residuals = {
            "mean": float(resid.mean()),
            "std": float(resid.std()),
            "max_abs": float(np.abs(resid).max()),
        }
        images = regression_charts(scores["y"], scores["pred"])
    out = Path(config.output_dir)
    atomic_write_json(out / METRICS_FILE, result.model_dump(mode="json", exclude={"lineage", "decision"}))
    training = Lineage.of(lineage).training
    trained = (training.cost, training.currency) if training is not None and training.cost is not None else None
    atomic_write_text(out / REPORT_FILE, _report(result, images, trained))
    atomic_write_json(out / DECISION_FILE, decision.model_dump(mode="json"))
    result.lineage = Lineage.of(lineage).with_(
        evaluation=EvaluationLineage(
            task=model.task,
            metrics={k: round(v, 6) for k, v in metrics.items()},
            passed=decision.passed,
            n_test=len(x_test),
            champion_version=champion.get("version") if champion else None,
            beats_champion=decision.beats_champion,
            alias=config.alias,
        )
    )
    if config.fail_on_gate and not decision.passed:
        raise GateFailed("gate not passed: " + "; ".join(decision.failures))
    return result


__all__ = ["NAME", "classification_metrics", "decide", "evaluate_model", "regression_metrics"]
