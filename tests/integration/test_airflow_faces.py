"""The Airflow faces on real runs: a step's log reaches the task log while the step runs; a task
that times out ends the step's whole process tree (the entrypoint, torchrun and every rank);
and the snapshot task emits the same asset event (the DVC hash retrain_dag listens for) in both
modes. Kubernetes cannot run here: the pod's own run is stood in for by the result the same
command gave on the worker, and everything after it (the operator's asset event) is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json, os, sys, threading, time, types, collections
from datetime import datetime, timedelta
mode, args = sys.argv[1], json.loads(sys.argv[2])

if mode == "stream":
    from trainpipe.components.train_model.airflow_task import TrainModelOperator
    op = TrainModelOperator(task_id="train_model", settings=args["settings"])
    seen = []
    class Recorder:  # the task log, noting whether the step was still running when each line came
        def info(self, fmt, *a):
            running = op._proc is not None and op._proc.poll() is None
            seen.append({"line": fmt % a if a else fmt, "running": running, "t": time.time()})
        def __getattr__(self, name):
            return lambda *a, **k: None
    op.__dict__["log"] = Recorder()
    op.__class__.log = property(lambda self: self.__dict__["log"])
    result = op.execute({"run_id": "manual__stream"})
    print(json.dumps({"seen": seen, "loss": result["final_loss"], "end": time.time()}))

elif mode == "timeout":
    os.environ.update({"AIRFLOW_HOME": args["home"], "AIRFLOW__CORE__DAGS_FOLDER": args["dags"],
                       "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db
    db.upgradedb()
    bag = DagBag(args["dags"])
    assert not bag.import_errors, bag.import_errors
    run = bag.dags["killed_by_timeout"].test()
    print(json.dumps({"state": str(run.state)}))

elif mode == "assets":
    from trainpipe.components.snapshot_dataset.airflow_task import SnapshotDatasetOperator
    from trainpipe.faces.airflow_operator import component_task
    from trainpipe.pipelines.dag_gates import dataset_asset
    from trainpipe.services.profiles import get_profile
    extras = {}
    for m in ("local", "kubernetes"):
        asset = dataset_asset("tiny")
        profile = get_profile("cpu") if m == "kubernetes" else None
        image = "trainpipe-data:test" if profile else None
        op = component_task(SnapshotDatasetOperator, "snapshot_dataset", args["settings"], mode=m, image=image,
                            profile=profile, outlets=[asset])
        if m == "kubernetes":  # the pod runs the same command: its run is stood in for by the worker's result
            from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
            worker_result = result
            KubernetesPodOperator.execute = lambda self, context: dict(worker_result)
        events = collections.defaultdict(lambda: types.SimpleNamespace(extra=None))
        result = op.execute({"run_id": "manual__assets", "outlet_events": events})
        extras[m] = {"type": type(op).__name__, "extra": events[asset].extra, "md5": result["md5"]}
    print(json.dumps(extras))
"""


def _script(mode: str, args: dict, env: dict | None = None, timeout: int = 600) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, digits_csv) -> Path:
    return make_snapshot(tmp_path_factory.mktemp("faces"), digits_csv, "label")


def _processes_naming(text: str) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                out.append(f"{proc.name}: {cmdline[:200]}")
    return out


def test_the_steps_log_reaches_the_task_log_while_it_runs(tmp_path, snapshot):
    settings = {
        "data": str(snapshot),
        "output_dir": str(tmp_path / "m"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "nproc_per_node": 1,
        "epochs": 4,
        "batch_size": 64,
        "checkpoint_every_steps": 0,
    }
    out = _script(
        "stream",
        {"settings": settings},
        env={"AIRFLOW_HOME": str(tmp_path / "home"), "TRAINPIPE_PROGRESS_EVERY_S": "0.1"},
    )
    epochs = [s for s in out["seen"] if "train_model: epoch" in s["line"]]
    assert len(epochs) == 4, [s["line"] for s in out["seen"]][-20:]
    # each epoch's line was in the task log while the step was still running, not all at its end
    assert all(s["running"] for s in epochs)
    progress = [s for s in out["seen"] if " batches (" in s["line"]]  # progress with rate and ETA, live too
    assert progress and all(s["running"] and "samples/s" in s["line"] for s in progress), [
        s["line"] for s in out["seen"]
    ][-20:]
    assert epochs[0]["t"] < epochs[-1]["t"] < out["end"]
    assert any(s["line"].startswith("trainpipe train_model: ok") for s in out["seen"])


def test_a_timed_out_task_ends_the_whole_step_and_leaves_no_process(tmp_path, snapshot):
    """About a minute: a DAG under dag.test() trains until its 25 s execution_timeout, which must end the step's whole
    process group; the Airflow metadata database is created first."""
    out_dir = tmp_path / "killed-model"
    dags = tmp_path / "dags"
    dags.mkdir()
    settings = {
        "data": str(snapshot),
        "output_dir": str(out_dir),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "nproc_per_node": 2,
        "epochs": 100_000,
        "batch_size": 64,
    }
    (dags / "killed.py").write_text(
        "from datetime import datetime, timedelta\n"
        "from airflow.sdk import DAG\n"
        "from trainpipe.components.train_model.airflow_task import TrainModelOperator\n"
        "with DAG(dag_id='killed_by_timeout', schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:\n"
        f"    TrainModelOperator(task_id='train_model', settings={settings!r}, retries=0, "
        "execution_timeout=timedelta(seconds=25))\n"
    )
    started = time.time()
    out = _script("timeout", {"home": str(tmp_path / "home"), "dags": str(dags)}, timeout=600)
    took = time.time() - started
    assert out["state"] in ("failed", "DagRunState.FAILED"), out
    # the ranks had started (the run was killed mid-training, not before it began)
    assert (out_dir / "checkpoints").is_dir() and any((out_dir / "checkpoints").iterdir())
    deadline = time.time() + 15
    while _processes_naming(str(out_dir)) and time.time() < deadline:
        time.sleep(0.5)
    assert _processes_naming(str(out_dir)) == [], "the timed-out step left processes behind"
    assert took < 240, f"dag.test() took {took:.0f} s: the timeout did not stop the step"


def test_the_snapshot_task_emits_the_same_asset_event_in_both_modes(tmp_path, tiny_csv):
    validated = tmp_path / "v"
    result_of(
        run_component(
            "validate_data", "--data", str(tiny_csv), "--output-dir", str(validated), "--label-column", "target"
        )
    )
    settings = {
        "data": str(validated),
        "output_dir": str(tmp_path / "s"),
        "repo_dir": str(tmp_path / "repo"),
        "remote_url": str(tmp_path / "remote"),
        "dataset_name": "tiny",
    }
    out = _script("assets", {"settings": settings}, env={"AIRFLOW_HOME": str(tmp_path / "home")})
    assert out["local"]["type"] == "SnapshotDatasetOperator" and out["kubernetes"]["type"] == "TrainpipePodOperator"
    assert out["local"]["extra"] is not None and out["local"]["extra"]["md5"] == out["local"]["md5"]
    made = {mode: out[mode]["extra"].pop("made_at") for mode in ("local", "kubernetes")}
    assert all(made.values()) and out["kubernetes"]["extra"] == out["local"]["extra"]  # when aside, the same event
