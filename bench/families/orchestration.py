"""The reference pipeline's steps run by hand against the same chain through `trainpipe run` on
kfp.local and under Airflow's dag.test()."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import PY, Bench, alternate, digits_snapshot, row, sh


def run(b: Bench) -> list[dict[str, Any]]:
    import yaml

    digits_snapshot(b.work)  # writes digits.csv
    n = [0]

    def config() -> Path:
        n[0] += 1
        d = b.work / f"orch-{n[0]}"
        d.mkdir()
        path = d / "pipeline.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "data": str(b.work / "digits.csv"),
                    "workspace": str(d / "ws"),
                    "dataset_name": "digits",
                    "model_name": "bench",
                    "thresholds": {"accuracy": 0.5},
                    "train": {"nproc_per_node": 1, "epochs": 2, "batch_size": 64, "checkpoint_every_steps": 0},
                }
            )
        )
        return path

    ran: list[str] = []  # the steps by hand (the pipeline runs the same ones)

    def by_hand() -> float:
        from trainpipe.pipelines.config import load_pipeline_config

        c = load_pipeline_config(config())
        out = Path(c.workspace) / "by-hand"
        track = ["--tracking-uri", c.tracking_uri]

        def step(name: str, *args: str) -> None:
            ran.append(name)
            sh(PY, "-m", f"trainpipe.components.{name}", "--output-dir", str(out / name), *args)

        t = time.perf_counter()
        ran.clear()
        step("validate_data", "--data", c.data)
        step(
            "snapshot_dataset",
            "--data",
            str(out / "validate_data"),
            "--repo-dir",
            c.dvc_repo_dir,
            "--remote-url",
            c.dvc_remote_url,
            "--dataset-name",
            "digits",
        )
        step("detect_drift", "--data", str(out / "snapshot_dataset"), "--model-name", "bench", *track)
        step(
            "train_model",
            "--data",
            str(out / "snapshot_dataset"),
            "--nproc-per-node",
            "1",
            "--epochs",
            "2",
            "--checkpoint-every-steps",
            "0",
            *track,
        )
        step("profile_training", "--model", str(out / "train_model"), *track)
        step(
            "evaluate_model",
            "--model",
            str(out / "train_model"),
            "--data",
            str(out / "snapshot_dataset"),
            "--thresholds",
            '{"accuracy": 0.5}',
            "--model-name",
            "bench",
            *track,
        )
        step(
            "register_model",
            "--model",
            str(out / "train_model"),
            "--decision",
            str(out / "evaluate_model"),
            "--training-profile",
            str(out / "profile_training"),
            "--model-name",
            "bench",
            *track,
        )
        return time.perf_counter() - t

    def engine(name: str) -> Callable[[], float]:
        return lambda: sh(
            str(Path(PY).parent / "trainpipe"),
            "run",
            "--config",
            str(config()),
            "--engine",
            name,
            env={"AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
        )[0]

    rows = []
    for name in ("kfp-local", "airflow-local"):
        base, ours = alternate(by_hand, engine(name), max(2, b.repeats - 1))
        rows.append(
            row(
                f"end to end on {name} ({len(ran)} steps, digits)",
                f"the {len(ran)} entrypoints run by hand",
                "s",
                base,
                ours,
                "≤ +3 s per step",
                False,
                lambda r, mb, mo: (mo - mb) / len(ran) <= 3.0,
                note="airflow-local includes creating its SQLite metadata DB" if name == "airflow-local" else "",
            )
        )
    return rows
