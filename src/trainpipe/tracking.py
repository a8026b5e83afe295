"""MLflow connection helpers shared by train_model, evaluate_model and register_model.

mlflow is imported inside the functions. Credentials come only from MLflow's own
environment variables (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME`` …),
never from component arguments, so they never reach a compiled pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError, ServiceUnavailable


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI to use: the setting, else ``MLFLOW_TRACKING_URI``.

    A bare path or ``sqlite:///relative`` is made absolute, so every step of a run
    (each in its own working directory) talks to the same store.

    Raises:
        InputError: neither is set, or the scheme is not one MLflow serves.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        raise InputError("tracking_uri: not set, and MLFLOW_TRACKING_URI is empty")
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        return "sqlite:///" + str(Path(path).resolve())
    if uri.startswith(("http://", "https://", "postgresql://", "postgresql+psycopg2://", "mysql://", "databricks")):
        return uri
    if "://" not in uri:
        raise InputError(f"tracking_uri: {uri!r} is not a URI (use sqlite:///path/mlflow.db or http(s)://host)")
    raise InputError(f"tracking_uri: unsupported scheme in {uri!r}")


def default_artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps artifacts when the store is a local SQLite file.

    A tracking server decides for itself (None); for ``sqlite:///dir/x.db`` it is
    ``dir/mlartifacts``, never the current directory.
    """
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    return None


def connect(uri: str | None) -> Any:
    """Point MLflow at the tracking store and check it answers.

    Returns:
        An ``mlflow.MlflowClient``.

    Raises:
        ServiceUnavailable: the server does not answer (transient; retry).
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    resolved = resolve_tracking_uri(uri)
    import mlflow

    mlflow.set_tracking_uri(resolved)
    client = mlflow.MlflowClient(tracking_uri=resolved)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:
        raise ServiceUnavailable(f"tracking_uri: MLflow at {redact(resolved)!r} is unavailable: {first_line(exc)}") from None
    return client


def ensure_experiment(client: Any, name: str, uri: str) -> str:
    """Get or create an experiment by name; returns its id."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(resolve_tracking_uri(uri)))


def redact(uri: str) -> str:
    """Drop any ``user:password@`` from a URI before it is printed or recorded."""
    if "@" in uri and "://" in uri:
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return uri


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
