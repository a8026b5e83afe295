"""register_model: the work. mlflow and torch are imported inside the function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainpipe.components.evaluate_model.spec import DECISION_FILE
from trainpipe.components.register_model.spec import LINEAGE_FILE, NAME, RegisterModelConfig, RegisterModelResult
from trainpipe.components.train_model.spec import MODEL_FILE
from trainpipe.contract import lineage as lineage_mod
from trainpipe.contract.errors import InputError, ServiceUnavailable, TrainpipeError
from trainpipe.contract.io import atomic_write_json, file_digest, read_json

HASH_TAG = "trainpipe.model_sha256"
DATA_TAG = "trainpipe.dataset_md5"


def find_existing(client: Any, name: str, model_sha256: str, dataset_md5: str) -> Any | None:
    """The version already registered for this exact model and data, if any."""
    for mv in client.search_model_versions(f"name = '{name}'"):
        if mv.tags.get(HASH_TAG) == model_sha256 and mv.tags.get(DATA_TAG) == dataset_md5:
            return mv
    return None


def register_model(config: RegisterModelConfig, lineage: dict[str, Any]) -> RegisterModelResult:
    """Register the model when its gate passed; idempotent for identical model and data.

    The version carries the flattened lineage as tags and ``lineage.json`` as an
    artifact; the alias (``champion`` by default) is pointed at it.

    Args:
        config: Settings and paths.
        lineage: The merged lineage of the model, the decision and the profile.

    Returns:
        The version and its ``models:/name@alias`` URI, or why nothing was registered.

    Raises:
        InputError: the decision or model artifact is unreadable.
        ServiceUnavailable: MLflow cannot be reached.
    """
    decision = read_json(Path(config.decision) / DECISION_FILE)
    lineage = dict(lineage)
    if not decision.get("passed"):
        reason = "gate not passed: " + "; ".join(decision.get("reasons", []))
        lineage["registration"] = {"registered": False}
        return RegisterModelResult(
            registered=False, created=False, model_name=config.model_name, version=None, alias=None, model_uri=None, reason=reason, lineage=lineage
        )
    training = lineage.get("training")
    snapshot = lineage.get("snapshot")
    if not training or not snapshot:
        raise InputError("model: its lineage lacks the training run or the snapshot; it was not made by this pipeline")
    sha = file_digest(Path(config.model) / MODEL_FILE, "sha256")
    if sha != training.get("model_sha256"):
        raise InputError("model: model.safetensors does not match the hash train_model recorded (the artifact was changed)")

    from trainpipe import tracking

    client = tracking.connect(config.tracking_uri)
    try:
        existing = find_existing(client, config.model_name, sha, snapshot["md5"])
        created = existing is None
        if existing is None:
            version = _create_version(client, config, lineage, sha, snapshot["md5"], training["mlflow_run_id"])
        else:
            version = existing.version
        client.set_registered_model_alias(config.model_name, config.alias, version)
    except InputError:
        raise
    except Exception as exc:
        status = getattr(exc, "get_http_status_code", lambda: 503)()
        if isinstance(status, int) and 400 <= status < 500:
            raise TrainpipeError(f"tracking_uri: MLflow refused the registration: {tracking.first_line(exc)}") from None
        raise ServiceUnavailable(f"tracking_uri: registering in MLflow failed: {tracking.first_line(exc)}") from None
    uri = f"models:/{config.model_name}@{config.alias}"
    lineage["registration"] = {"model_name": config.model_name, "version": str(version), "alias": config.alias}
    atomic_write_json(Path(config.output_dir) / LINEAGE_FILE, lineage)
    return RegisterModelResult(
        registered=True,
        created=created,
        model_name=config.model_name,
        version=str(version),
        alias=config.alias,
        model_uri=uri,
        reason="gate passed" if created else "identical model and data already registered; alias ensured",
        lineage=lineage,
    )


def _create_version(client: Any, config: RegisterModelConfig, lineage: dict[str, Any], sha: str, md5: str, run_id: str) -> str:
    import tempfile

    import mlflow
    import numpy as np
    from mlflow.models import infer_signature

    from trainpipe.components.train_model.models import load_model, predict_proba, serving_module

    model, meta = load_model(config.model)
    mean, std = np.asarray(meta["mean"], dtype=np.float32), np.asarray(meta["std"], dtype=np.float32)
    example = np.stack([mean, mean + std])
    signature = infer_signature(example, predict_proba(model, meta, example))
    with mlflow.start_run(run_id=run_id):
        import torch

        info = mlflow.pytorch.log_model(
            serving_module(model, meta),
            name="model",
            signature=signature,
            input_example=example,
            # Pickle, not torch.export: an exported graph fixes the batch size seen in the example.
            serialization_format="pickle",
            # Stated, not inferred: inference spawns a process and takes seconds.
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"],
        )
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / LINEAGE_FILE
            atomic_write_json(path, lineage)
            mlflow.log_artifact(str(path), artifact_path="trainpipe")
    tags = {k: v[:5000] for k, v in lineage_mod.flatten(lineage).items()}
    tags.update({HASH_TAG: sha, DATA_TAG: md5, "trainpipe.training_run_id": run_id})
    mv = mlflow.register_model(info.model_uri, config.model_name, tags=tags)
    return str(mv.version)


__all__ = ["NAME", "find_existing", "register_model"]
