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


def test_early_stopping_on_two_ranks_ends_the_run_where_it_left_through_a_stop_a_retry_and_a_rerun(tmp_path, tiny_csv):
    """A team's function on arrays of its own leaves its loop (``break``) inside the first epoch, on 2 gloo
    ranks, and the platform's SIGTERM comes just after (``preempt:after``: the step's own process, once its
    ranks finished): exit 75 with one line, the MLflow run KILLED, never RUNNING. The retry resumes at the end
    the function chose and trains nothing past it: the partial epoch's line, the classes of its rows
    (``no``/``yes``, not indices), the same MLflow run. A rerun into the finished folder logs no second run
    and its result says where it resumed, as its log does. Three short runs (about 30 s on two idle cores, over
    a minute on loaded ones): the stop, the retry and the rerun each need a process of their own."""
    import mlflow

    out, db = tmp_path / "m", f"sqlite:///{tmp_path / 'ml.db'}"
    cmd = [
        *("--data", str(tiny_csv), "--label-column", "target", "--output-dir", str(out), "--tracking-uri", db),
        *("--epochs", "2", "--batch-size", "16", "--train-function", "teampkg.early:train"),
        *("--train-config", json.dumps({"leave_at_step": 5})),  # 12 steps an epoch: it leaves in the first
    ]
    env = {"PYTHONPATH": str(FIXTURES)}
    stopped = run_component("train_model", *cmd, env={**env, "TRAINPIPE_FAULT": "preempt:after"})
    last = stopped.stderr.strip().splitlines()[-1]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert (
        last
        == (
            "trainpipe train_model: preempted by SIGTERM after its ranks' last step, before the model was "
            "logged: a retry resumes from ckpt-0000000005"
        )
        and "Traceback" not in stopped.stderr
    )
    assert "step 5 loss" in stopped.stderr and "(the function left its loop: the run ends here)" in stopped.stderr
    trainer = json.loads((out / "checkpoints" / "ckpt-0000000005" / "trainer.json").read_text())
    assert trainer["ended"] and [h["step"] for h in trainer["history"]] == [5]  # the partial epoch's line
    client = mlflow.MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("trainpipe").experiment_id])
    assert run.info.status == "KILLED"

    retry = result_of(run_component("train_model", *cmd, env=env))
    assert (retry["resumed_from_step"], retry["global_steps"], retry["mlflow_run_id"]) == (5, 5, run.info.run_id)
    assert retry["classes"] == ["no", "yes"] == json.loads((out / "model.json").read_text())["classes"]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [5]

    rerun = run_component("train_model", *cmd, env=env)
    again = result_of(rerun)
    assert "resuming from ckpt-0000000005" in rerun.stderr and again["resumed_from_step"] == 5
    assert (again["mlflow_run_id"], again["model_uri"]) == (retry["mlflow_run_id"], retry["model_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("trainpipe").experiment_id])
    assert run.info.status == "FINISHED"
