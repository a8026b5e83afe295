"""The names of the files and folders inside the artifacts one step writes and another reads, in
one place, so that the writer and its readers cannot disagree. A name only its own component reads
stays in that component's spec.

Stdlib only and importing nothing of trainpipe: the bottom of the library's layers (the contract's
artifact references read :data:`MARKER`).
"""

from __future__ import annotations

# A model's files. The loader every registered model carries (``trainpipe.services.serving.loader``) travels without
# trainpipe, so it spells these names itself; tests/unit/test_layout.py holds the two spellings equal.
#: A model's weights (safetensors: reading them runs no code).
MODEL_FILE = "model.safetensors"
#: What to build around the weights (builder, features, task, classes).
MODEL_META = "model.json"
#: An optimized model's graph, beside its ``model.json``.
ONNX_FILE = "model.onnx"

#: In every finished output folder: the step's result and lineage (a folder without it is not done).
MARKER = "trainpipe.json"

# train_model's output folder (profile_training and register_model read it)
#: One line per epoch: the means of what the training function logged.
EPOCH_METRICS_FILE = "metrics.jsonl"
#: Each rank's step records, device figures and profiler window (``rank<N>.json``).
TELEMETRY_DIR = "telemetry"
#: Checkpoint folders, when the settings name no checkpoint_dir.
CHECKPOINT_DIR = "checkpoints"
#: A rank's permanent error (``rank<N>.json``), read by the launcher to stop the group at once.
ERRORS_DIR = ".errors"

# evaluate_model's output folder (register_model reads it)
DECISION_FILE = "decision.json"

# optimize_model's output folder (register_model reads it)
OPTIMIZATION_FILE = "optimization.json"
#: The accepted variant, ready to register (``model.onnx`` and ``model.json``).
OPTIMIZED_MODEL_DIR = "model"

# tune_model's output folder (train_model's ``tuned`` input reads it)
#: The best trial's train_model settings.
TUNED_SETTINGS_FILE = "best_settings.json"

__all__ = [
    "CHECKPOINT_DIR",
    "DECISION_FILE",
    "EPOCH_METRICS_FILE",
    "ERRORS_DIR",
    "MARKER",
    "MODEL_FILE",
    "MODEL_META",
    "ONNX_FILE",
    "OPTIMIZATION_FILE",
    "OPTIMIZED_MODEL_DIR",
    "TELEMETRY_DIR",
    "TUNED_SETTINGS_FILE",
]
