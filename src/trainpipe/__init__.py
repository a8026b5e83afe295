"""trainpipe: reusable, containerized ML pipeline components.

Importing this package loads no ML framework, no data tooling and no
orchestrator SDK; the heavy parts are imported where they are used.
"""

from trainpipe.contract.plugins import defer_feast_headers

__version__ = "0.1.0"

# Feast's MLflow plugin would otherwise load all of Feast into every process that imports MLflow.
defer_feast_headers()

COMPONENTS = (
    "validate_data",
    "snapshot_dataset",
    "train_model",
    "profile_training",
    "evaluate_model",
    "register_model",
    "detect_drift",
    "optimize_model",
    "tune_model",
)

__all__ = ["COMPONENTS", "__version__"]
