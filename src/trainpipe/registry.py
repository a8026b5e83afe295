"""The MLflow model registry as trainpipe uses it: aliases, idempotency tags, and the
weights-only copy of each registered model that a champion is loaded from.

A registered version's run holds ``trainpipe_model/`` (model.safetensors + model.json):
the champion is rebuilt from those weights, so comparing against it never unpickles
anything. mlflow is imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


HASH_TAG = "trainpipe.model_sha256"
DATA_TAG = "trainpipe.dataset_md5"
RUN_TAG = "trainpipe.training_run_id"
WEIGHTS_ARTIFACT = "trainpipe_model"
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


def download_weights(version: Any, dest: str | Path) -> Path:
    """Download a version's ``trainpipe_model/`` (weights-only) into ``dest``."""
    import mlflow

    run_id = version.tags.get(RUN_TAG) or version.run_id
    path = mlflow.artifacts.download_artifacts(artifact_uri=f"runs:/{run_id}/{WEIGHTS_ARTIFACT}", dst_path=str(dest))
    return Path(path)
