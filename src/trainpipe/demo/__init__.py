"""The demo: scikit-learn's bundled digits (shipped inside the package, no download)
written out as a raw CSV, and a pipeline config for it.
"""

from __future__ import annotations

from pathlib import Path

from trainpipe.contract.io import atomic_write_text


def write_digits(path: str | Path) -> Path:
    """Write the 1,797 8x8 digits as ``pixel_0 … pixel_63, label`` CSV (stable bytes)."""
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    return atomic_write_text(path, frame.to_csv(index=False))


def write_demo_config(workspace: str | Path) -> Path:
    """Write the demo's data and config under ``workspace``; returns the config path."""
    ws = Path(workspace).resolve()
    data = write_digits(ws / "raw" / "digits.csv")
    config = ws / "pipeline.yaml"
    atomic_write_text(
        config,
        "# trainpipe demo: scikit-learn's digits, trained with 2 gloo ranks on CPU.\n"
        f"data: {data}\n"
        "label_column: label\n"
        f"workspace: {ws}\n"
        "dataset_name: digits\n"
        "suite: builtin:default\n"
        "model_name: trainpipe-digits\n"
        "thresholds: {accuracy: 0.9, f1_macro: 0.9}\n"
        "train: {nproc_per_node: 2, epochs: 8, batch_size: 64, learning_rate: 0.05, hidden_units: [64]}\n",
    )
    return config
