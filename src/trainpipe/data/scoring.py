"""A model's figures on labelled rows: the task's metrics that evaluate_model gates on and tune_model
scores trials with. scikit-learn and NumPy are imported inside the functions."""

from __future__ import annotations

import math
from typing import Any

from trainpipe.contract.errors import InputError

#: Metrics where lower is better (the rest are higher-is-better).
LOWER_IS_BETTER = frozenset({"log_loss", "mae", "rmse"})
#: The metrics each task is scored on (:func:`task_metrics`), by name.
TASK_METRICS = {
    "classification": ("accuracy", "f1_macro", "precision_macro", "recall_macro", "roc_auc", "log_loss"),
    "regression": ("mae", "rmse", "r2"),
}


def probabilities(proba: Any) -> Any:
    """Class probabilities as float64 rows that sum to one: a model's softmax in float32 (or bf16) sums to
    one only within its rounding, which scikit-learn's log loss warns about on every evaluation."""
    import numpy as np

    p = np.clip(np.asarray(proba, dtype=np.float64), 1e-15, None)
    return p / p.sum(axis=1, keepdims=True)


def classification_metrics(y: Any, proba: Any, n_classes: int) -> dict[str, Any]:
    """Accuracy, macro precision/recall/F1, ROC AUC (one-vs-rest, macro), log loss, per-class
    figures, the confusion matrix and the micro-averaged ROC curve."""
    import numpy as np
    from sklearn import metrics as skm

    labels = list(range(n_classes))
    proba = probabilities(proba)
    pred = proba.argmax(axis=1)
    p, r, f1, _ = skm.precision_recall_fscore_support(y, pred, average="macro", labels=labels, zero_division=0)
    pc, rc, fc, sc = skm.precision_recall_fscore_support(y, pred, average=None, labels=labels, zero_division=0)
    try:
        if n_classes == 2:
            auc = float(skm.roc_auc_score(y, proba[:, 1]))
        else:
            auc = float(skm.roc_auc_score(y, proba, multi_class="ovr", average="macro", labels=labels))
    except ValueError:  # a class absent from the held-out split: undefined, and the gate fails closed on it
        auc = float("nan")
    onehot = np.eye(n_classes)[y]
    fpr, tpr, thr = skm.roc_curve(onehot.ravel(), proba.ravel())
    keep = np.unique(np.linspace(0, len(fpr) - 1, min(len(fpr), 200)).astype(int))  # enough points to draw
    fpr, tpr, thr = fpr[keep], tpr[keep], thr[keep]
    return {
        "metrics": {
            "accuracy": float(skm.accuracy_score(y, pred)),
            "f1_macro": float(f1),
            "precision_macro": float(p),
            "recall_macro": float(r),
            "roc_auc": auc,
            "log_loss": float(skm.log_loss(y, proba, labels=labels)),
        },
        "per_class": [
            {"precision": float(a), "recall": float(b), "f1": float(c), "support": float(d)}
            for a, b, c, d in zip(pc, rc, fc, sc, strict=True)
        ],
        "confusion_matrix": skm.confusion_matrix(y, pred, labels=labels).tolist(),
        "roc_curve": {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "thresholds": np.nan_to_num(thr, posinf=1.0).tolist()},
    }


def regression_metrics(y: Any, pred: Any) -> dict[str, float]:
    """MAE, RMSE and R² of predictions."""
    from sklearn import metrics as skm

    return {
        "mae": float(skm.mean_absolute_error(y, pred)),
        "rmse": float(math.sqrt(skm.mean_squared_error(y, pred))),
        "r2": float(skm.r2_score(y, pred)),
    }


def task_metrics(model: Any, x: Any, y_raw: Any) -> dict[str, float]:
    """The task's metrics of a loaded model (:func:`trainpipe.services.serving.loader.load`) on ``(x, y_raw)``.

    Raises:
        InputError: the model's outputs do not fit the labels.
    """
    import numpy as np

    from trainpipe.data.tabular import encode_labels

    if model.task == "classification":
        classes, y = encode_labels(y_raw, model.classes or None)
        proba = model.predict_proba(x)
        if proba.shape[1] != len(classes):
            raise InputError(f"model: it gives {proba.shape[1]} outputs for {len(classes)} classes")
        return dict(classification_metrics(y, proba, len(classes))["metrics"])
    pred = np.asarray(model.predict_values(x), dtype=np.float64)
    return regression_metrics(np.asarray(y_raw, dtype=np.float64), pred)
