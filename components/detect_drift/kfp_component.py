"""KFP v2 face of detect_drift. Holds no logic: it calls the entrypoint.

The decision is the return value (``Output``: whether to retrain), a single one because kfp.local
resolves ``dsl.If`` only on a task's ``Output``; ``drift`` holds the per-column figures.
"""

from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Output

from trainpipe.faces.kfp_face import component


@component
def detect_drift(
    data: Input[Dataset],
    drift: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    reference: Input[Dataset] = None,
    label_column: str = "label",
    model_name: str = "",
    champion_alias: str = "champion",
    tracking_uri: str = "",
    categorical_columns: list = [],
    drift_share: float = 0.5,
    column_methods: dict = {},
    column_thresholds: dict = {},
    sample_size: int = 100000,
    seed: int = 0,
    max_champion_age_days: float = 0.0,
    prediction_drift_retrains: bool = False,
    drift_experiment: str = "trainpipe-drift",
    retrain_on: str = "drift",
    dataset_md5: str = "",
    run_id: str = "",
) -> bool:
    """Compare the snapshot with the champion's training data (through its lineage); returns whether to retrain."""
    from trainpipe.faces.kfp_runtime import check_dataset_hash, copy_file, log_metrics, run_entrypoint

    check_dataset_hash(data, dataset_md5)
    result = run_entrypoint(
        "detect_drift",
        {
            "data": data.path,
            "reference": reference.path if reference is not None else "",
            "output_dir": drift.path,
            "label_column": label_column,
            "model_name": model_name,
            "champion_alias": champion_alias,
            "tracking_uri": tracking_uri,
            "categorical_columns": categorical_columns,
            "drift_share": drift_share,
            "column_methods": column_methods,
            "column_thresholds": column_thresholds,
            "sample_size": sample_size,
            "seed": seed,
            "max_champion_age_days": max_champion_age_days,
            "prediction_drift_retrains": prediction_drift_retrains,
            "drift_experiment": drift_experiment,
            "retrain_on": retrain_on,
        },
        run_id=run_id,
        output=drift.path,
    )
    drift.metadata.update(
        {
            "retrain": result["retrain"],
            "reasons": result["reasons"],
            "dataset_drift": result["dataset_drift"],
            "drifted_columns": result["drifted_columns"],
        }
    )
    log_metrics(
        metrics,
        {
            "share_drifted": result["share_drifted"],
            "dataset_drift": float(result["dataset_drift"]),
            "retrain": float(result["retrain"]),
        },
    )
    copy_file(drift.path + "/report.html", report.path)
    return bool(result["retrain"])
