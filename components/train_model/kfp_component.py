"""KFP v2 face of train_model. Holds no logic: it calls the entrypoint (which runs torchrun)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def train_model(
    snapshot: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    label_column: str = "label",
    backend: str = "torch_ddp",
    model_arch: str = "mlp",
    precision: str = "fp32",
    nproc_per_node: int = 2,
    nnodes: int = 1,
    cluster: dict = {},
    device: str = "auto",
    epochs: int = 10,
    max_steps: int = 0,
    batch_size: int = 64,
    learning_rate: float = 0.05,
    hidden_units: list = [64],
    test_fraction: float = 0.2,
    seed: int = 0,
    max_restarts: int = 3,
    checkpoint_every_steps: int = 50,
    tracking_uri: str = "",
    experiment_name: str = "trainpipe",
    dataset_md5: str = "",
    run_id: str = "",
):
    """Train with torch DDP (gloo on CPU, NCCL on GPU), TensorFlow multi-worker or Horovod and log the run to MLflow.

    With nnodes > 1 and a ``cluster`` section ({"shared_pvc": ..., "launcher": "trainjob"}),
    the step submits a Kubeflow Trainer TrainJob (or a PyTorchJob) and waits for it.
    """
    from trainpipe.faces.kfp_runtime import check_dataset_hash, log_metrics, run_entrypoint

    check_dataset_hash(snapshot, dataset_md5)
    result = run_entrypoint(
        "train_model",
        {
            "data": snapshot.path,
            "output_dir": model.path,
            "label_column": label_column,
            "backend": backend,
            "model": model_arch,
            "precision": precision,
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "cluster": cluster or None,
            "device": device,
            "epochs": epochs,
            "max_steps": max_steps or None,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "hidden_units": hidden_units,
            "test_fraction": test_fraction,
            "seed": seed,
            "max_restarts": max_restarts,
            "checkpoint_every_steps": checkpoint_every_steps,
            "tracking_uri": tracking_uri,
            "experiment_name": experiment_name,
        },
        run_id=run_id,
    )
    model.metadata.update({"framework": "pytorch", "backend": result["backend"], "precision": result["precision"], "sha256": result["model_sha256"], "mlflow_run_id": result["mlflow_run_id"]})
    log_metrics(metrics, {"final_loss": result["final_loss"], "train_accuracy": result["train_accuracy"], "wall_seconds": result["wall_seconds"]})
