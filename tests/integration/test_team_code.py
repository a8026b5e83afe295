"""A team's own code on real runs: its config arrives exactly as written (by hand, through the Airflow
operator's command, through a team's own KFP pipeline that passes a dict holding a pipeline parameter,
run by kfp.local), and a task killed with SIGKILL stops the training it started, at a checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, result_of, run_component
from tests.unit.test_config_roundtrip import same

pytestmark = pytest.mark.integration

FIXTURES = REPO / "tests" / "fixtures"
#: What a team writes: exponents, a big integer, a nested mapping whose keys are not sorted, unicode, nulls.
CONFIG = {
    "learning_rate": 1e-05,
    "eps": 1e-08,
    "scale": 1e16,
    "seed_bits": 2**60 + 1,
    "zeta": {"z": 1, "a": [0.1, None, True], "é": {}},
    "tags": [],
}


def _env(echo: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(FIXTURES), "TEAMPKG_ECHO": str(echo)}


def _train(digits_csv: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("--data", str(digits_csv), "--output-dir", str(out), "--epochs", "1", "--nproc-per-node", "1"),
        *("--train-function", "teampkg.echo:train", "--tracking-uri", f"sqlite:///{out.parent / 'ml.db'}"),
        *extra,
    ]


def test_by_hand_the_config_arrives_as_written(tmp_path, digits_csv):
    echo = tmp_path / "echo.json"
    args = _train(digits_csv, tmp_path / "m", "--train-config", json.dumps(CONFIG))
    result_of(run_component("train_model", *args, env=_env(echo)))
    assert same(json.loads(echo.read_text()), CONFIG), echo.read_text()


def test_through_the_airflow_operator_the_config_arrives_as_written(tmp_path, digits_csv, monkeypatch):
    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    echo = tmp_path / "echo.json"
    for key, value in _env(echo).items():
        monkeypatch.setenv(key, value)
    settings = {
        "data": str(digits_csv),
        "output_dir": str(tmp_path / "m"),
        "train_function": "teampkg.echo:train",
        "train_config": CONFIG,
        "epochs": 1,
        "nproc_per_node": 1,
        "tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}",
    }
    TrainModelOperator(task_id="train_model", settings=settings).execute({"run_id": "manual__team"})
    assert same(json.loads(echo.read_text()), CONFIG), echo.read_text()


def test_a_teams_kfp_pipeline_passes_a_dict_with_a_pipeline_parameter_and_it_arrives_exactly(
    tmp_path, digits_csv, monkeypatch
):
    """``train_model(train_config={"hidden_units": [32, 16], "learning_rate": lr})`` no longer fails to
    compile with STRUCT against STRING; the parameter's value arrives as a float, the constants as written."""
    from kfp import dsl, local

    from trainpipe.components.train_model.kfp_component import train_model

    echo = tmp_path / "echo.json"
    for key, value in _env(echo).items():
        monkeypatch.setenv(key, value)

    @dsl.pipeline(name="team-pipeline")
    def team(data_uri: str, tracking_uri: str, lr: float = 0.1) -> None:
        raw = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
        train_model(
            data=raw.output,
            train_function="teampkg.echo:train",
            train_config={"hidden_units": [32, 16], "learning_rate": lr, "zeta": {"z": 1, "a": 1e-08}},
            epochs=1,
            nproc_per_node=1,
            tracking_uri=tracking_uri,
        )

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    team(data_uri=str(digits_csv), tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}", lr=1e-05)
    got = json.loads(echo.read_text())
    assert same(got, {"hidden_units": [32, 16], "learning_rate": 1e-05, "zeta": {"z": 1, "a": 1e-08}}), got


def test_a_killed_task_stops_its_training_at_a_checkpoint(tmp_path, digits_csv):
    """SIGKILL to the process running the Airflow operator (a timeout, "mark failed", an OOM kill): the
    entrypoint gets SIGTERM from the kernel, its ranks checkpoint and stop; nothing trains on under PID 1."""
    out = tmp_path / "m"
    task = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from trainpipe.components.train_model.airflow_task import TrainModelOperator\n"
            "TrainModelOperator(task_id='t', settings=json.loads(sys.argv[1])).execute({'run_id': 'manual__kill'})\n",
            json.dumps(
                {
                    "data": str(digits_csv),
                    "output_dir": str(out),
                    "train_function": "teampkg.slow:train",
                    "train_config": {"sleep_s": 0.05},
                    "epochs": 50,
                    "tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}",
                }
            ),
        ],
        env={**os.environ, "PYTHONPATH": str(FIXTURES)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not (out / "metrics.jsonl").exists():  # training is under way
        assert task.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    task.send_signal(signal.SIGKILL)
    task.wait()
    deadline = time.monotonic() + 30
    left: list[str] = []
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"the killed task's training outlived it: {left}"
    assert list((out / "checkpoints").glob("ckpt-*")), "it stopped without the checkpoint a retry resumes from"
