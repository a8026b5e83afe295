"""train_model on a real Slurm cluster (munged, slurmctld, slurmd started by the tests on loopback ports):
the CLI and the training DAG under dag.test(), preemption with requeue and exact resume, scancel from
on_kill, and a job that fails on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_snapshot, result_of, run_component
from tests.helpers.pipeline import run_pipeline
from tests.helpers.slurm_cluster import missing, slurm_cluster

pytestmark = pytest.mark.integration

SLURM = {"profile": "cpu", "poll_s": 0.5}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    gone = missing()
    if gone:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm is required under CI (make slurm installs it): missing {', '.join(gone)}")
        pytest.skip(f"Slurm is not installed (make slurm): missing {', '.join(gone)}")
    before = os.environ.get("SLURM_CONF")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as env:
        os.environ.update(env)
        try:
            yield env
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = before


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, digits_csv):
    return make_snapshot(tmp_path_factory.mktemp("slurm-data"), digits_csv, "label")


def _job(job_id: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def _ended(job_id: str, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(job_id)
        if job.get("JobState") not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end: {_job(job_id)}")


def _wait_for(path_glob: tuple[Path, str], text: str, timeout: float = 120) -> Path:
    folder, pattern = path_glob
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in folder.glob(pattern):
            if text in log.read_text(errors="replace"):
                return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in {folder}/{pattern}")


def test_a_warned_job_checkpoints_requeues_and_ends_as_an_uninterrupted_run_registered_from_the_cli(
    tmp_path, slurm, snapshot, mlflow_server
):
    """Slow on purpose (about a minute): a real Slurm job is warned mid-training, checkpoints, is requeued by
    slurmctld and trains to the end, and its result is compared with an uninterrupted run's."""
    import mlflow

    common = [
        "--data",
        str(snapshot),
        "--tracking-uri",
        mlflow_server,
        "--experiment-name",
        "slurm",
        "--nproc-per-node",
        "2",
        "--epochs",
        "30",
        "--batch-size",
        "64",
        "--checkpoint-every-steps",
        "20",
    ]
    out = tmp_path / "train"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainpipe.components.train_model", *common, "--output-dir", str(out)]
        + ["--slurm", json.dumps(SLURM)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Slurm's warning, as --signal=USR1@N sends it before the time limit, once training is under way
    log = _wait_for((out / "slurm", "slurm-*.out"), "epoch 2/")
    job_id = json.loads((out / "slurm" / "job.json").read_text())["job_id"]
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    job = _job(job_id)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", job  # the same job id, requeued once
    text = log.read_text()
    assert "attempt 2" in text and "train_model: resuming from ckpt-" in text, text[-2000:]
    assert result["resumed_from_step"] > 0 and result["lineage"]["training"]["cluster_job"] == f"slurm/{job_id}"
    assert (out / "model.safetensors").is_file()
    # submitted by hand, run by Slurm on the cpu profile: the lineage says so (it said manual and local)
    assert result["lineage"]["orchestrator"] == {"name": "slurm", "run_id": f"slurm-{job_id}"}, result["lineage"]
    assert result["lineage"]["training"]["hardware_profile"] == "cpu"

    plain = result_of(run_component("train_model", *common, "--output-dir", str(tmp_path / "plain")))
    assert result["model_sha256"] == plain["model_sha256"], "the requeued job did not end as an uninterrupted run"

    client = mlflow.MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("slurm")
    runs = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`trainpipe.orchestrator_run_id` = 'slurm-{job_id}'"
    )
    assert [r.info.run_id for r in runs] == [result["mlflow_run_id"]] and runs[0].info.status == "FINISHED"

    # the rest of the chain from the CLI, on the model the Slurm job made
    result_of(
        run_component(
            "evaluate_model",
            "--model",
            str(out),
            "--data",
            str(snapshot),
            "--output-dir",
            str(tmp_path / "eval"),
            "--thresholds",
            '{"accuracy": 0.5}',
        )
    )
    registered = result_of(
        run_component(
            "register_model",
            "--model",
            str(out),
            "--decision",
            str(tmp_path / "eval"),
            "--output-dir",
            str(tmp_path / "reg"),
            "--model-name",
            "slurm-cli",
            "--tracking-uri",
            mlflow_server,
        )
    )
    version = client.get_model_version("slurm-cli", registered["version"])
    assert version.tags["lineage.training.cluster_job"] == f"slurm/{job_id}", version.tags


TEAM = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "fixtures")}


def test_a_job_whose_function_raises_is_exit_2_with_the_ranks_line(tmp_path, slurm, snapshot):
    proc = run_component(
        "train_model",
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "m"),
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--nproc-per-node",
        "1",
        "--epochs",
        "1",
        "--train-function",
        "teampkg.bad:raises",
        "--slurm",
        json.dumps(SLURM),
        env=TEAM,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("trainpipe train_model: error: ") and "the team's code broke" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and (tmp_path / "m" / "slurm" / "job.json").exists()  # it ran there
    assert not (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--train-config", '{"hiden_units": [8]}'], "train_config.hiden_units'?: unknown key"),
        (["--train-function", "teampkg.typed:train", "--train-config", '{"learning_rate": "0.1"}'], "valid number"),
        (["--train-function", "teampkg.bad:wrong_signature"], "trainpipe calls it as f\\(ctx, config\\)"),
    ],
)
def test_a_typo_fails_in_a_second_before_anything_is_queued(tmp_path, slurm, snapshot, given, said):
    import re

    t0 = time.monotonic()
    proc = run_component(
        "train_model",
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "m"),
        *given,
        "--slurm",
        json.dumps(SLURM),
        env=TEAM,
    )
    assert proc.returncode == 2 and re.search(said, proc.stderr.strip().splitlines()[-1]), proc.stderr[-2000:]
    assert not (tmp_path / "m" / "slurm" / "job.json").exists() and time.monotonic() - t0 < 30


def test_a_job_cancelled_from_outside_ends_the_step_with_exit_8(tmp_path, slurm, snapshot):
    out = tmp_path / "m"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainpipe.components.train_model", "--data", str(snapshot), "--output-dir", str(out)]
        + ["--epochs", "200", "--nproc-per-node", "1", "--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"]
        + ["--slurm", json.dumps(SLURM)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for((out / "slurm", "slurm-*.out"), "epoch 1/")
    job_id = json.loads((out / "slurm" / "job.json").read_text())["job_id"]
    subprocess.run(["scancel", job_id], check=True)  # an operator, not trainpipe
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 8, stderr[-2000:]
    assert f"slurm: job {job_id} was cancelled outside trainpipe" in stderr.strip().splitlines()[-1]


def test_refused_settings_fail_before_anything_is_submitted(tmp_path, slurm, snapshot):
    proc = run_component(
        "train_model",
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "m"),
        "--slurm",
        json.dumps({**SLURM, "partition": "no-such-partition"}),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "sbatch refused the job" in last and "partition" in last.lower(), last
    assert not (tmp_path / "m" / "slurm" / "job.json").exists()


def test_on_kill_cancels_the_job_whether_deferred_or_waiting_in_the_task(tmp_path, slurm, snapshot):
    from airflow.sdk.exceptions import TaskDeferred

    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    settings = {
        "data": str(snapshot),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "epochs": 200,
        "nproc_per_node": 1,
        "slurm": {**SLURM, "job_name": "onkill"},
    }
    # deferrable (the default): execute submits and hands the wait to the triggerer
    deferred = TrainModelOperator(task_id="train", settings={**settings, "output_dir": str(tmp_path / "a")})
    with pytest.raises(TaskDeferred) as info:
        deferred.execute({"run_id": "manual__a"})
    job_a = info.value.trigger.job_id
    assert _job(job_a)["JobState"] in ("PENDING", "RUNNING")
    deferred.on_kill()
    assert _ended(job_a)["JobState"] == "CANCELLED"

    # not deferrable: the task itself waits; killing it cancels the job
    waiting = TrainModelOperator(
        task_id="train", settings={**settings, "output_dir": str(tmp_path / "b")}, deferrable=False
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            waiting.execute({"run_id": "manual__b"})
        except BaseException as exc:  # the killed task's failure
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    _wait_for((tmp_path / "b" / "slurm", "slurm-*.out"), "trainpipe: job")
    job_b = json.loads((tmp_path / "b" / "slurm" / "job.json").read_text())["job_id"]
    waiting.on_kill()
    t.join(timeout=60)
    assert not t.is_alive() and errors
    assert _ended(job_b)["JobState"] == "CANCELLED"


def test_the_training_dag_runs_train_model_on_slurm_and_registers(tmp_path, slurm, digits_csv, mlflow_server):
    """Under dag.test() the deferred wait runs inline: submit, trigger, collect, then the rest of the DAG."""
    cfg = {
        "data": str(digits_csv),
        "workspace": str(tmp_path / "ws"),
        "dataset_name": "digits",
        "model_name": "slurm-dag",
        "tracking_uri": mlflow_server,
        "thresholds": {"accuracy": 0.5},
        "train": {"nproc_per_node": 2, "epochs": 2, "batch_size": 64, "slurm": SLURM},
    }
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = run_pipeline(config, "airflow-local", tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "registered model : slurm-dag version 1" in proc.stdout, proc.stdout
    import mlflow

    tags = mlflow.MlflowClient(mlflow_server).get_model_version("slurm-dag", "1").tags
    assert tags["lineage.training.cluster_job"].startswith("slurm/") and tags["lineage.orchestrator.name"] == "airflow"
    log = Path(next(ln for ln in proc.stdout.splitlines() if ln.startswith("full log")).split(":", 1)[1].strip())
    assert "[DAG TEST] running trigger in line" in log.read_text()
