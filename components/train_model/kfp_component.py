"""KFP v2 face of train_model. Holds no logic: it calls the entrypoint (which runs torchrun)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def train_model(
    snapshot: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    label_column: str = "label",
    nproc_per_node: int = 2,
    device: str = "auto",
    epochs: int = 10,
    batch_size: int = 64,
    learning_rate: float = 0.05,
    hidden_units: list = [64],
    test_fraction: float = 0.2,
    seed: int = 0,
    max_restarts: int = 1,
    tracking_uri: str = "",
    experiment_name: str = "trainpipe",
    run_id: str = "",
):
    """Train with PyTorch DDP (gloo on CPU, NCCL on GPU) and log the run to MLflow."""
    from trainpipe.faces.kfp_runtime import log_metrics, run_entrypoint

    result = run_entrypoint(
        "train_model",
        {
            "data": snapshot.path,
            "output_dir": model.path,
            "label_column": label_column,
            "nproc_per_node": nproc_per_node,
            "device": device,
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "hidden_units": hidden_units,
            "test_fraction": test_fraction,
            "seed": seed,
            "max_restarts": max_restarts,
            "tracking_uri": tracking_uri,
            "experiment_name": experiment_name,
        },
        run_id=run_id,
    )
    model.metadata.update({"framework": "pytorch", "sha256": result["model_sha256"], "mlflow_run_id": result["mlflow_run_id"]})
    log_metrics(metrics, {"final_loss": result["final_loss"], "train_accuracy": result["train_accuracy"], "wall_seconds": result["wall_seconds"]})
