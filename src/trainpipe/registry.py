"""The MLflow model registry as trainpipe uses it: aliases, idempotency tags, and the
weights-only copy of each registered model that a champion is loaded from.

A registered version is made from the MLflow model train_model logged, which holds the
weights-only artifact (model.safetensors + model.json): the champion is rebuilt from those
weights, so comparing against it never unpickles anything. mlflow is imported inside the
functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


HASH_TAG = "trainpipe.model_sha256"
DATA_TAG = "trainpipe.dataset_md5"
RUN_TAG = "trainpipe.training_run_id"
#: On an optimized version: ``<model>/<version>`` it was made from; on that version: the optimized one.
PARENT_TAG = "trainpipe.parent_version"
OPTIMIZED_TAG = "trainpipe.optimized_version"
CHAMPION = "champion"
CHALLENGER = "challenger"


def alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The version an alias points at; None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    from trainpipe import tracking

    try:
        # A search sees only what the caller may read; with MLflow's auth app, asking for an
        # alias of a model that does not exist yet is "permission denied", not "not found".
        if not client.search_registered_models(filter_string=f"name = '{name}'"):
            return None
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        code = getattr(exc, "error_code", "")
        if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise tracking.classify(exc, f"tracking_uri: reading alias {alias!r} of {name!r}", "failed") from None


def logged_model_id(version: Any) -> str | None:
    """The MLflow logged model a registered version was made from (``models:/<id>``)."""
    model_id = getattr(version, "model_id", None)
    if model_id:
        return str(model_id)
    source = str(getattr(version, "source", "") or "")
    return source[len("models:/"):].split("/")[0] if source.startswith("models:/m-") else None


def version_model(client: Any, version: Any, runtime: Any) -> tuple[Any | None, str]:
    """A registered version's model rebuilt from its weights-only copy (nothing unpickled; a team's
    code only where ``runtime`` trusts it): ``(model, "")``, or ``(None, why it cannot be)``. What
    evaluate_model compares a challenger with, and detect_drift scores both sides with."""
    import tempfile

    from trainpipe import tracking
    from trainpipe.contract.errors import InputError
    from trainpipe.serving.package import load_artifact

    with tempfile.TemporaryDirectory() as tmp:
        try:
            weights = download_weights(client, version, tmp)
        except Exception as exc:  # noqa: BLE001 (a foreign version or an artifact store hiccup: the caller goes on without it)
            return None, f"its weights-only copy cannot be read: {tracking.first_line(exc)}"
        try:
            return load_artifact(weights, runtime, "champion"), ""
        except InputError as exc:
            return None, str(exc)


def download_weights(client: Any, version: Any, dest: str | Path) -> Path:
    """Download a version's weights-only artifact (``model.safetensors`` + ``model.json``, inside its
    MLflow model at ``artifacts/model/``) into ``dest``. Nothing is unpickled.

    Raises:
        ValueError: the version was not made from a trainpipe logged model.
    """
    import mlflow

    from trainpipe.serving.package import WEIGHTS_DIR

    model_id = logged_model_id(version)
    if model_id is None:
        raise ValueError(f"version {version.version} was not registered from a trainpipe model (source {version.source})")
    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{location}/artifacts/{WEIGHTS_DIR}", dst_path=str(dest)))
