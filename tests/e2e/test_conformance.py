"""Conformance: every component gives the same outputs through its KFP face (kfp.local), its
Airflow face (``dag.test()``, local mode) and its bare entrypoint, on the same inputs, with a
team's own training function (tests/fixtures/teampkg) in the place of the built-in one. That
function (a GRU) first checks that its ``train_config`` arrived with the types it was written with
(an int hidden size, a float, text, a list of ints, a nested mapping): a setting reaches the
component as it was given on every engine, KFP's included.

Each way runs the whole chain in its own workspace (own DVC repository and remote, own embedded
MLflow store) from the same raw file and settings, so each component sees the same inputs.
Outputs must agree exactly (hashes, counts, decisions, registry state) and numerically within
1e-6 (losses, metrics); only paths, run ids, timings and timestamps may differ.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import result_of, run_component

pytestmark = pytest.mark.e2e

TRAIN = {
    "train_function": "teampkg.sequence:train",
    "train_config": {"hidden": 24, "lr": 0.01, "note": "gru", "steps": [8, 8], "nested": {"depth": 1, "scale": 0.5}},
    "nproc_per_node": 1,
    "epochs": 2,
    "batch_size": 64,
    "seed": 3,
}
TEAM = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "fixtures")}

#: What may differ between faces: where things were written, ids and clocks.
VOLATILE = {
    "validate_data": {"docs_page"},
    "snapshot_dataset": {"rev", "remote_url", "repo_dir"},
    "train_model": {"mlflow_run_id", "wall_seconds", "usage", "cost", "tracking_uri", "experiment_id", "model_uri"},
    "profile_training": {
        "mlflow_run_id",
        "samples_per_second",
        "step_time_ms",
        "breakdown_ms",
        "achieved_tflops",
        "mfu",
        "peak_rss_mb",
        "cpu_utilization",
        "rank_skew",
        "recommendations",
        "collective_ms_per_step",
    },
    "evaluate_model": set(),
    "register_model": set(),
    "detect_drift": set(),
}


def _config(tmp_path: Path, data: Path, name: str) -> Path:
    path = tmp_path / name / "pipeline.yaml"
    path.parent.mkdir()
    path.write_text(
        yaml.safe_dump(
            {
                "data": str(data),
                "workspace": str(path.parent / "ws"),
                "dataset_name": "digits",
                "model_name": "conformance",
                "thresholds": {"accuracy": 0.3},
                "train": TRAIN,
            }
        )
    )
    return path


def _run_engine(config: Path, engine: str) -> dict[str, dict]:
    from trainpipe.runs import collect_results

    env = {**os.environ, **TEAM, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "run", "--config", str(config), "--engine", engine],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    root = config.parent / "ws" / ("kfp-local" if engine == "kfp-local" else "airflow-runs")
    return collect_results(root)


def _run_bare(config: Path) -> dict[str, dict]:
    """The entrypoints by hand, with the settings the pipeline passes."""
    from trainpipe.pipelines.config import load_pipeline_config

    c = load_pipeline_config(config)
    out = Path(c.workspace) / "by-hand"
    track = {"tracking_uri": c.tracking_uri}

    def step(name: str, **settings) -> dict:
        args = [
            a
            for k, v in settings.items()
            for a in ("--" + k.replace("_", "-"), v if isinstance(v, str) else json.dumps(v))
        ]
        env = {
            **TEAM,
            "TRAINPIPE_TRUSTED_MODEL_CODE": "teampkg",
        }  # what trainpipe run sets for the config's training function
        return result_of(run_component(name, "--output-dir", str(out / name), *args, env=env))

    results = {
        "validate_data": step(
            "validate_data",
            data=c.data,
            label_column=c.label_column,
            suite=c.suite,
            **{k: getattr(c.train, k) for k in ("task", "batch_size", "test_fraction", "seed")},
        ),
        "snapshot_dataset": step(
            "snapshot_dataset",
            data=str(out / "validate_data"),
            repo_dir=c.dvc_repo_dir,
            remote_url=c.dvc_remote_url,
            dataset_name=c.dataset_name,
        ),
        "detect_drift": step(
            "detect_drift",
            data=str(out / "snapshot_dataset"),
            label_column=c.label_column,
            model_name=c.model_name,
            alias=c.alias,
            drift_share=c.drift_share,
            seed=c.train.seed,
            retrain_on=c.retrain_on,
            **track,
        ),
        "train_model": step(
            "train_model",
            data=str(out / "snapshot_dataset"),
            label_column=c.label_column,
            experiment_name=c.experiment_name,
            **track,
            **c.train.model_dump(mode="json", exclude_none=True),
        ),
        "profile_training": step("profile_training", model=str(out / "train_model"), **track),
        "evaluate_model": step(
            "evaluate_model",
            model=str(out / "train_model"),
            data=str(out / "snapshot_dataset"),
            label_column=c.label_column,
            thresholds=c.thresholds,
            model_name=c.model_name,
            **track,
        ),
    }
    results["register_model"] = step(
        "register_model",
        model=str(out / "train_model"),
        decision=str(out / "evaluate_model"),
        training_profile=str(out / "profile_training"),
        model_name=c.model_name,
        alias=c.alias,
        **track,
    )
    return results


def _differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a.keys() ^ b.keys())} in one only"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) else [f"{where}: {a} != {b}"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _comparable(name: str, result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in VOLATILE[name] and k not in ("lineage", "_path")}


def test_each_component_gives_the_same_outputs_through_kfp_airflow_and_by_hand(tmp_path, digits_csv):
    """Slow on purpose (about 1.5 minutes): the whole chain runs three times, through kfp.local, dag.test() and
    the bare entrypoints, each in its own workspace, since agreement between the three is the claim."""
    runs = {
        "kfp-local": _run_engine(_config(tmp_path, digits_csv, "kfp"), "kfp-local"),
        "airflow-local": _run_engine(_config(tmp_path, digits_csv, "airflow"), "airflow-local"),
        "entrypoint": _run_bare(_config(tmp_path, digits_csv, "bare")),
    }
    for face, results in runs.items():
        assert sorted(results) == sorted(VOLATILE), f"{face} ran {sorted(results)}"
    reference = runs["entrypoint"]
    for face in ("kfp-local", "airflow-local"):
        for name in VOLATILE:
            diffs = _differences(_comparable(name, reference[name]), _comparable(name, runs[face][name]), name)
            assert diffs == [], f"{face} differs from the bare entrypoint: {diffs[:5]}"
        # the data each step saw is the same: the lineage carries the same hashes
        for name in ("train_model", "evaluate_model", "register_model"):
            assert runs[face][name]["lineage"]["snapshot"]["md5"] == reference[name]["lineage"]["snapshot"]["md5"]
        assert (
            runs[face]["train_model"]["lineage"]["orchestrator"]["name"]
            == {"kfp-local": "kfp", "airflow-local": "airflow"}[face]
        )
    # what the comparison rests on is real: a hash, a trained model and a registered version
    assert reference["snapshot_dataset"]["md5"] == reference["validate_data"]["data_md5"]
    assert len(reference["train_model"]["model_sha256"]) == 64
    assert reference["register_model"]["version"] == "1" and reference["evaluate_model"]["decision"]["passed"] is True
    assert reference["train_model"]["train_function"] == "teampkg.sequence:train"
