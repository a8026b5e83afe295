"""KFP v2 face of train_model: its parameters are the spec's settings (generated); declared here are
its artifacts and what the result puts on them. With nnodes > 1 and a ``cluster`` section
({"shared_pvc": ..., "launcher": "trainjob"}) the step submits a Kubeflow Trainer TrainJob (or a
PyTorchJob) and waits for it."""

from typing import Any

from trainpipe.components.train_model.spec import NAME, TrainModelParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> None:
    from trainpipe.faces.kfp_runtime import log_metrics

    meta = {k: result[k] for k in ("task", "train_function", "mlflow_run_id", "model_uri")}
    artifacts["model"].metadata.update({"framework": "pytorch", "sha256": result["model_sha256"], **meta})
    metrics = {f"train_{k}": v for k, v in result["metrics"].items()}
    log_metrics(artifacts["metrics"], {**metrics, "wall_seconds": result["wall_seconds"]})


FACE = Face(
    NAME,
    TrainModelParams,
    [In("data"), Out("model", "Model", field="output_dir"), Out("metrics", "Metrics"), In("tuned", optional=True)],
    "Run a training function (built-in or a team's) on torch DDP, FSDP2, Horovod or TensorFlow and log the run and "
    "the model to MLflow.",
    publish,
    reads_snapshot=True,
)
train_model = FACE.component()
