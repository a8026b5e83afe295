"""DAG integrity, in Airflow's own style: the DAG file parses with no import errors, without
touching the metadata database or looking up a connection, and every task carries retries
with a capped exponential backoff, a timeout and documentation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract

PARSE_GUARDED = """
import sqlalchemy.engine, sqlalchemy.orm
from airflow.models.connection import Connection

def refuse(what):
    def _f(*a, **k):
        raise AssertionError(f"{{what}} while parsing the DAG file")
    return _f

sqlalchemy.engine.Engine.connect = refuse("a database connection")
sqlalchemy.orm.Session.execute = refuse("a database query")
Connection.get_connection_from_secrets = classmethod(refuse("a connection lookup"))
from airflow.sdk.bases.hook import BaseHook
BaseHook.get_connection = classmethod(refuse("a connection lookup"))

import importlib.util
spec = importlib.util.spec_from_file_location("training_dag", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = mod.dag
print("parsed", dag.dag_id, len(dag.tasks))
for t in dag.tasks:
    assert t.doc_md, f"{{t.task_id}} has no doc_md"
    assert t.execution_timeout is not None, f"{{t.task_id}} has no execution_timeout"
    # conditions on XComs: a retry reads the same
    if t.task_id not in ("gate", "new_snapshot", "retrain"):
        assert t.retries >= 1 and t.retry_exponential_backoff and t.max_retry_delay is not None, t.task_id
assert dag.doc_md and dag.max_active_runs == 1 and dag.catchup is False
print("ok")
"""


def _config(tmp_path):
    """A minimal pipeline config, as every process of a deployment names it in TRAINPIPE_CONFIG."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"data: {tmp_path / 'data.csv'}\n")
    return path


def test_a_dag_without_trainpipe_config_is_one_import_error(tmp_path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("TRAINPIPE_CONFIG", None)
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag({str(REPO / 'dags')!r})\n"
        "import json; print(json.dumps({'dags': len(bag.dags), 'errors': sorted(bag.import_errors.values())}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["dags"] == 0 and len(got["errors"]) == 3, got  # no DAG parses with defaults
    for error in got["errors"]:
        assert "ImportError: TRAINPIPE_CONFIG is not set: every scheduler, dag-processor and worker" in error, error


@pytest.mark.parametrize("dag_file", ["training_dag.py", "retrain_dag.py", "ingest_dag.py"])
@pytest.mark.parametrize("mode", ["local", "kubernetes"])
def test_dag_parses_without_database_or_connections(tmp_path, mode, dag_file):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # an unreachable database: parsing must not need one
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////nonexistent-trainpipe-dir/airflow.db",
        "TRAINPIPE_AIRFLOW_MODE": mode,
        "TRAINPIPE_CONFIG": str(_config(tmp_path)),
    }
    code = PARSE_GUARDED.format(path=str(REPO / "dags" / dag_file))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok"


def test_the_guard_would_catch_a_lookup(tmp_path):
    dag_file = tmp_path / "bad_dag.py"
    dag_file.write_text("from airflow.sdk.bases.hook import BaseHook\nBaseHook.get_connection('mlflow')\ndag = None\n")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run(
        [sys.executable, "-c", PARSE_GUARDED.format(path=str(dag_file))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0 and "a connection lookup while parsing the DAG file" in proc.stderr


POD_CHECK = """
import importlib.util, json
from kubernetes.client import ApiClient
spec = importlib.util.spec_from_file_location("training_dag", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = {{}}
for t in mod.dag.tasks:
    if t.task_id in ("gate", "retrain"):
        continue
    pod = ApiClient().sanitize_for_serialization(t.build_pod_request_obj())
    out[t.task_id] = pod
print(json.dumps(out))
"""


def _assert_restricted(spec: dict) -> None:
    """The fields Pod Security Standard "restricted" requires, on the pod and every container."""
    pod_sc = spec.get("securityContext", {})
    assert pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 1) != 0
    assert pod_sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert set(sc.get("capabilities", {}).get("add") or []) <= {"NET_BIND_SERVICE"}, c["name"]
        assert not sc.get("privileged"), c["name"]
        assert sc.get("runAsUser", 1) != 0 and sc.get("runAsNonRoot", True) is True, c["name"]
    for v in spec.get("volumes", []):
        assert "hostPath" not in v


def test_kubernetes_mode_pods_carry_the_profile_and_validate_strictly(tmp_path):
    import json

    import yaml

    from tests.helpers.k8s_schema import validate_pod

    profile = tmp_path / "gpu-team.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "gpu-team",
                "train": {
                    "cpu_request": "8",
                    "cpu_limit": "16",
                    "memory_request": "32G",
                    "memory_limit": "64G",
                    "accelerator_type": "nvidia.com/gpu",
                    "accelerator_count": 2,
                },
                "node_selector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "service_account": "trainpipe-runner",
                "image_pull_secrets": ["regcred"],
                "secrets_as_env": {"mlflow-credentials": {"password": "MLFLOW_TRACKING_PASSWORD"}},
            }
        )
    )
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": "s3://bucket/raw.csv",
                "profile": str(profile),
                "policy": {"allowed_regions": ["me-central-1"], "require_encryption": True},
            }
        )
    )
    # The operator reads a kubeconfig to build the pod; no cluster is contacted (none exists here).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "offline",
                "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [
                    {"name": "offline", "context": {"cluster": "offline", "user": "nobody", "namespace": "team-a"}}
                ],
                "users": [{"name": "nobody", "user": {}}],
            }
        )
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_AIRFLOW_MODE": "kubernetes",
        "TRAINPIPE_CONFIG": str(cfg),
        "TRAINPIPE_IMAGE_REGISTRY": "registry.example/team-a",
        "KUBECONFIG": str(kubeconfig),
    }
    env.pop("TRAINPIPE_IMAGE", None)
    proc = subprocess.run(
        [sys.executable, "-c", POD_CHECK.format(path=str(REPO / "dags" / "training_dag.py"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pods = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(pods) == {
        "validate_data",
        "snapshot_dataset",
        "detect_drift",
        "train_model",
        "profile_training",
        "evaluate_model",
        "register_model",
    }
    for pod in pods.values():
        validate_pod(pod["spec"], pod["metadata"])
        spec = pod["spec"]
        c = spec["containers"][0]
        assert (
            spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            and spec["tolerations"][0]["key"] == "nvidia.com/gpu"
        )
        assert spec["serviceAccountName"] == "trainpipe-runner" and spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert (
            spec["securityContext"]["runAsNonRoot"] is True
            and c["securityContext"]["allowPrivilegeEscalation"] is False
        )
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        _assert_restricted(spec)
        secret_env = [e for e in c.get("env", []) if e.get("valueFrom")]
        assert secret_env == [
            {
                "name": "MLFLOW_TRACKING_PASSWORD",
                "valueFrom": {"secretKeyRef": {"key": "password", "name": "mlflow-credentials"}},
            }
        ]
        policy = {e["name"]: e.get("value") for e in c.get("env", [])}[
            "TRAINPIPE_POLICY"
        ]  # the config's policy, on every pod
        assert json.loads(policy) == {"allowed_regions": ["me-central-1"], "require_encryption": True}
    assert pods["train_model"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # the training pod's ranks serve metrics (the profile's metrics_port): the PodMonitor's label and port annotation
    train_meta = pods["train_model"]["metadata"]
    assert (
        train_meta["labels"]["trainpipe.io/metrics"] == "true"
        and train_meta["annotations"]["prometheus.io/port"] == "9450"
    )
    assert "--metrics-port" in pods["train_model"]["spec"]["containers"][0]["args"]
    assert "trainpipe.io/metrics" not in (pods["evaluate_model"]["metadata"].get("labels") or {})
    # one place (trainpipe.services.images) picks each task's image: GPU training, slim data steps, CPU for the rest
    images = {t: p["spec"]["containers"][0]["image"] for t, p in pods.items()}
    assert images == {
        "validate_data": "registry.example/team-a/trainpipe-data:0.1.0",
        "snapshot_dataset": "registry.example/team-a/trainpipe-data:0.1.0",
        "train_model": "registry.example/team-a/trainpipe-gpu:0.1.0",
        "profile_training": "registry.example/team-a/trainpipe-cpu:0.1.0",
        "evaluate_model": "registry.example/team-a/trainpipe-cpu:0.1.0",
        "register_model": "registry.example/team-a/trainpipe-cpu:0.1.0",
        "detect_drift": "registry.example/team-a/trainpipe-cpu:0.1.0",
    }
    assert "nvidia.com/gpu" not in pods["evaluate_model"]["spec"]["containers"][0]["resources"]["limits"]


def test_retrain_dag_is_scheduled_on_the_dataset_asset(tmp_path):
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('r', {str(REPO / 'dags' / 'retrain_dag.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "t = importlib.util.spec_from_file_location('t', " + repr(str(REPO / "dags" / "training_dag.py")) + ")\n"
        "tm = importlib.util.module_from_spec(t); t.loader.exec_module(tm)\n"
        "assets = list(m.dag.timetable.asset_condition.objects)\n"
        "print([a[0].uri if isinstance(a, tuple) else a for a in assets])\n"
        "outlets = tm.dag.get_task('snapshot_dataset').outlets\n"
        "print([o.uri for o in outlets])\n"
        "print(sorted(m.dag.task_dict))\n"
        # the event the training DAG's snapshot emits says its own run trains that snapshot
        "task = tm.dag.get_task('snapshot_dataset')\n"
        "events = {o: type('E', (), {'extra': None})() for o in task.outlets}\n"
        "result = {'md5': 'm', 'rev': 'r', 'path': 'p', 'remote_url': 'u', 'committed': True}\n"
        "task.emit_assets({'task': task, 'dag': tm.dag, 'run_id': 'manual__1', 'outlet_events': events}, result)\n"
        "print(next(iter(events.values())).extra['trained_by'])\n"
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_CONFIG": str(_config(tmp_path)),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "trainpipe://datasets/dataset" in lines[-4] and lines[-3] == "['trainpipe://datasets/dataset']"
    assert "new_snapshot" in lines[-2] and "register_model" in lines[-2] and "validate_data" not in lines[-2]
    assert lines[-1] == "run manual__1 of trainpipe_training", lines[-1]  # the retraining DAG leaves it to that run


INGESTED = """
import importlib.util, json, sys
def load(name):
    spec = importlib.util.spec_from_file_location(name, sys.argv[1] + "/" + name + ".py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m
ingest, retrain = load("ingest_dag"), load("retrain_dag")
task = ingest.dag.get_task("snapshot_dataset")
events = {o: type("E", (), {"extra": None})() for o in task.outlets}
result = {"md5": "m", "rev": "r", "path": "p", "remote_url": "u", "committed": True, "snapshot_dir": "/s"}
task.emit_assets({"task": task, "dag": ingest.dag, "run_id": "manual__2", "outlet_events": events}, result)
event = next(iter(events.values()))
listened = [a[0].uri if isinstance(a, tuple) else a.uri for a in retrain.dag.timetable.asset_condition.objects]
print(json.dumps({"tasks": sorted(ingest.dag.task_dict), "outlets": [o.uri for o in task.outlets],
                  "listened": listened, "extra": event.extra}))
"""


def test_the_ingest_dag_snapshots_new_data_for_the_retrain_dag(tmp_path):
    """With only the training and retrain DAGs deployed, every snapshot said its own run trained it and the
    retrain DAG never retrained: the ingest DAG's event carries no trained_by, on the asset retrain listens to."""
    from trainpipe.pipelines.dag_gates import new_snapshot

    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_CONFIG": str(_config(tmp_path)),
    }
    proc = subprocess.run(
        [sys.executable, "-c", INGESTED, str(REPO / "dags")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tasks"] == ["snapshot_dataset", "validate_data"]
    assert got["outlets"] == got["listened"] and "trained_by" not in got["extra"] and got["extra"]["made_at"]
    event = type("E", (), {"extra": got["extra"]})()
    assert new_snapshot({"asset": [event]}) == got["extra"]["snapshot_dir"]


TUNED_DAG = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("training_dag", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = mod.dag
out = {"tasks": sorted(dag.task_dict), "upstream_of_train": sorted(dag.task_dict["train_model"].upstream_task_ids)}
workers = dag.task_dict.get("tune_model_workers")
if workers is not None:
    out["mapped"] = type(workers).__name__
    variants = workers.expand_input.value["settings"]
    out["variants"] = [(s["worker"], s["summarize"], s["output_dir"].rsplit("/", 1)[1]) for s in variants]
settings = getattr(dag.task_dict["train_model"], "settings", None)
out["tuned"] = settings.get("tuned") if settings else None
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["local", "kubernetes"])
def test_with_tune_the_training_dag_fans_out_workers_before_the_training(tmp_path, mode):
    import json

    import yaml

    cfg = tmp_path / "pipeline.yaml"
    space = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}}
    cfg.write_text(yaml.safe_dump({"data": "raw.csv", "tune": {"workers": 2, "space": space}}))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_AIRFLOW_MODE": mode,
        "TRAINPIPE_CONFIG": str(cfg),
    }
    proc = subprocess.run(
        [sys.executable, "-c", TUNED_DAG, str(REPO / "dags" / "training_dag.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["upstream_of_train"] == ["tune_model"]
    if mode == "local":
        assert got["mapped"] == "MappedOperator"
        assert got["variants"] == [[0, False, "tune_model-worker-0"], [1, False, "tune_model-worker-1"]]
        assert got["tuned"].endswith("/tune_model")
    else:  # one pod task per worker, in a task group
        assert {"tune_model_workers.tune_model_workers_0", "tune_model_workers.tune_model_workers_1"} <= set(
            got["tasks"]
        )
