"""The demo: scikit-learn's bundled digits (shipped inside the package, no download)
written out as a raw CSV, and a pipeline config for it; and a generated Parquet directory of any
size, to try data beyond memory.
"""

from __future__ import annotations

from pathlib import Path

from trainpipe.contract.io import atomic_write_text


def write_digits(path: str | Path) -> Path:
    """Write the 1,797 8x8 digits as ``pixel_0 … pixel_63, label`` CSV (stable bytes)."""
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    return atomic_write_text(path, frame.to_csv(index=False))


def write_parquet_dir(
    path: str | Path, rows: int, files: int, *, features: int = 40, group_rows: int = 50_000, seed: int = 0
) -> Path:
    """Write a synthetic classification table (``f0 … f{features-1}`` float32 and ``label``, the
    sign pattern of ``f0`` and ``f1``: four classes) as ``files`` Parquet files of ``group_rows``-row
    groups. Written beside ``path`` and renamed into place, so a folder there is always whole."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(files):
        x = rng.standard_normal((rows // files, features), dtype=np.float32)
        y = ((x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)).astype(np.int64)
        table = pa.table({f"f{j}": x[:, j] for j in range(features)} | {"label": y})
        pq.write_table(table, tmp / f"part-{i:03d}.parquet", row_group_size=group_rows)
    tmp.rename(path)
    return path


def write_demo_config(workspace: str | Path, profile: str = "cpu") -> Path:
    """Write the demo's data and config under ``workspace``; returns the config path. ``profile``
    cpu-smb also optimizes the model for CPU serving (optimize_model) and registers that variant."""
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
        f"profile: {profile}\n"
        "suite: builtin:default\n"
        "model_name: trainpipe-digits\n"
        "thresholds: {accuracy: 0.9, f1_macro: 0.9}\n"
        "train:\n"
        "  train_function: builtin:mlp\n"
        "  train_config: {learning_rate: 0.05, hidden_units: [64]}\n"
        "  nproc_per_node: 2\n"
        "  epochs: 8\n"
        "  batch_size: 64\n",
    )
    return config
