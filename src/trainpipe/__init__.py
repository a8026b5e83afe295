"""trainpipe: reusable, containerized ML pipeline components.

Importing this package loads no ML framework, no data tooling and no
orchestrator SDK; the heavy parts are imported where they are used.
"""

__version__ = "0.1.0"

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
