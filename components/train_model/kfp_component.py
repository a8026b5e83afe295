"""KFP v2 face of train_model. Holds no logic: it calls the entrypoint (which starts the ranks)."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from trainpipe.faces.kfp_face import component


@component
def train_model(
    data: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    train_function: str = "builtin:mlp",
    train_config: dict = {},
    task: str = "classification",
    label_column: str = "label",
    backend: str = "torch_ddp",
    horovod_binding: str = "torch",
    precision: str = "fp32",
    nproc_per_node: int = 2,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str = "",
    cluster: dict = {},
    device: str = "auto",
    dist_backend: str = "auto",
    epochs: int = 10,
    max_steps: int = 0,
    batch_size: int = 64,
    test_fraction: float = 0.2,
    seed: int = 0,
    max_restarts: int = 3,
    collective_timeout_s: int = 300,
    device_data_share: float = 0.25,
    profile_steps: int = 0,
    metrics_port: int = 0,
    checkpoint_every_s: float = 300.0,
    checkpoint_every_steps: int = 0,
    keep_checkpoints: int = 2,
    serving_requirements: list = [],
    tracking_uri: str = "",
    experiment_name: str = "trainpipe",
    dataset_md5: str = "",
    run_id: str = "",
):
    """Run a training function (built-in or a team's) on torch DDP, FSDP2, Horovod or TensorFlow and log the run and the model to MLflow.

    With nnodes > 1 and a ``cluster`` section ({"shared_pvc": ..., "launcher": "trainjob"}),
    the step submits a Kubeflow Trainer TrainJob (or a PyTorchJob) and waits for it.
    """
    from trainpipe.faces.kfp_runtime import check_dataset_hash, log_metrics, run_entrypoint

    check_dataset_hash(data, dataset_md5)
    result = run_entrypoint(
        "train_model",
        {
            "data": data.path,
            "output_dir": model.path,
            "train_function": train_function,
            "train_config": train_config,
            "task": task,
            "label_column": label_column,
            "backend": backend,
            "horovod_binding": horovod_binding,
            "precision": precision,
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "node_rank": node_rank,
            "rdzv_endpoint": rdzv_endpoint,
            "cluster": cluster,
            "device": device,
            "dist_backend": dist_backend,
            "epochs": epochs,
            "max_steps": max_steps,
            "batch_size": batch_size,
            "test_fraction": test_fraction,
            "seed": seed,
            "max_restarts": max_restarts,
            "collective_timeout_s": collective_timeout_s,
            "device_data_share": device_data_share,
            "profile_steps": profile_steps,
            "metrics_port": metrics_port,
            "checkpoint_every_s": checkpoint_every_s,
            "checkpoint_every_steps": checkpoint_every_steps,
            "keep_checkpoints": keep_checkpoints,
            "serving_requirements": serving_requirements,
            "tracking_uri": tracking_uri,
            "experiment_name": experiment_name,
        },
        run_id=run_id,
        output=model.path,
    )
    model.metadata.update(
        {
            "framework": "pytorch",
            "task": result["task"],
            "train_function": result["train_function"],
            "sha256": result["model_sha256"],
            "mlflow_run_id": result["mlflow_run_id"],
            "model_uri": result["model_uri"],
        }
    )
    log_metrics(
        metrics, {**{f"train_{k}": v for k, v in result["metrics"].items()}, "wall_seconds": result["wall_seconds"]}
    )
