"""Multi-tenant scheduling, offline: the cluster-side objects a platform team creates
(cluster/kueue.yaml: namespaces, PriorityClasses, Kueue's ResourceFlavors, ClusterQueues,
LocalQueues and WorkloadPriorityClasses) validate against Kubernetes' and Kueue's own schemas and
refer to each other; a team's hardware profile (cluster/profile-team-a.yaml) puts its namespace,
Kueue queue, priority class and rank anti-affinity on every pod and job trainpipe writes: the KFP
pipeline's pods, Airflow's pods, TrainJobs and PyTorchJobs, each validated by its own schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tests.contract.test_dag_integrity import POD_CHECK
from tests.helpers.k8s_schema import validate_core, validate_kueue, validate_pod, validate_pytorchjob, validate_trainjob
from trainpipe.components.train_model import k8s
from trainpipe.components.train_model.spec import ClusterJob
from trainpipe.services import pods
from trainpipe.services.profiles import PROFILES, get_profile

pytestmark = pytest.mark.contract

TEAM = str(REPO / "cluster" / "profile-team-a.yaml")


def _objects() -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / "cluster" / "kueue.yaml").read_text()) if d]


def test_the_cluster_examples_validate_and_refer_to_each_other():
    objs = _objects()
    by_kind: dict[str, dict[str, dict]] = {}
    for obj in objs:
        (validate_kueue if obj["apiVersion"].startswith("kueue.x-k8s.io/") else validate_core)(obj)
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"] + "/" + obj["metadata"].get("namespace", "")] = obj
    names = {kind: {k.split("/")[0] for k in objs_} for kind, objs_ in by_kind.items()}
    assert {
        "Namespace",
        "PriorityClass",
        "WorkloadPriorityClass",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
    } <= set(by_kind)
    for lq in by_kind["LocalQueue"].values():
        assert lq["spec"]["clusterQueue"] in names["ClusterQueue"] and lq["metadata"]["namespace"] in names["Namespace"]
    for cq in by_kind["ClusterQueue"].values():
        for group in cq["spec"]["resourceGroups"]:
            assert {f["name"] for f in group["flavors"]} <= names["ResourceFlavor"]
    assert names["PriorityClass"] == names["WorkloadPriorityClass"]  # one name, both schedulers
    team = get_profile(TEAM)
    assert (
        f"{team.kueue_queue}/{team.namespace}" in by_kind["LocalQueue"]
        and team.priority_class in names["PriorityClass"]
    )


def test_the_validators_refuse_what_kueue_would_not_take():
    cq = next(o for o in _objects() if o["kind"] == "ClusterQueue")
    typo = json.loads(json.dumps(cq))
    typo["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalquota"] = 1
    with pytest.raises(Exception, match="nominalquota"):
        validate_kueue(typo)
    lq = next(o for o in _objects() if o["kind"] == "LocalQueue")
    with pytest.raises(AssertionError, match="Namespaced"):
        validate_kueue({**lq, "metadata": {"name": "training"}})
    wpc = next(o for o in _objects() if o["kind"] == "WorkloadPriorityClass")
    with pytest.raises(Exception, match="'value' is a required property"):
        validate_kueue({k: v for k, v in wpc.items() if k != "value"})


def test_the_team_profile_reaches_trainjobs_and_pytorchjobs():
    team = get_profile(TEAM)
    cluster = ClusterJob(shared_pvc="team-a-train")  # no namespace: the profile's
    args = (
        "trainpipe-train-abc",
        cluster,
        3,
        1,
        "/m/j/train.json",
        "/m/j/result.json",
        team,
        "registry.example/trainpipe@sha256:" + "0" * 64,
    )
    tj = k8s.trainjob_manifest(k8s.NodeJob(*args))
    validate_trainjob(tj)
    pj = k8s.pytorchjob_manifest(k8s.NodeJob(*args, max_restarts=3))
    validate_pytorchjob(pj)
    for job in (tj, pj):
        assert job["metadata"]["namespace"] == "team-a"
        assert (
            job["metadata"]["labels"][pods.QUEUE_LABEL] == "training"
            and job["metadata"]["labels"][pods.PRIORITY_LABEL] == "training-high"
        )
    templates = [
        tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
            "spec"
        ]["template"],
        *(r["template"] for r in pj["spec"]["pytorchReplicaSpecs"].values()),
    ]
    # a TrainJob's pod patch cannot name a PriorityClass (its priority is Kueue's label on the job); a PyTorchJob's pods
    # do
    assert "priorityClassName" not in templates[0]["spec"] and {
        t["spec"]["priorityClassName"] for t in templates[1:]
    } == {"training-high"}
    for t in templates:
        assert (
            t["spec"]["terminationGracePeriodSeconds"] == team.termination_grace_s
        )  # time to checkpoint after SIGTERM
        assert t["metadata"]["labels"][pods.JOB_LABEL] == "trainpipe-train-abc"
        spread = t["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert spread == [
            {
                "labelSelector": {"matchLabels": {pods.JOB_LABEL: "trainpipe-train-abc"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
        assert t["spec"]["affinity"].get("nodeAffinity") is None  # the profile asks for none: only the spread
    # the built-in profiles ask nothing of Kueue, and spread ranks where they can
    plain = k8s.trainjob_manifest(
        k8s.NodeJob("trainpipe-train-abc", ClusterJob(shared_pvc="x"), 2, 1, "/c", "/r", PROFILES["gpu"], "img:1")
    )
    assert plain["metadata"]["namespace"] == "kubeflow" and not set(plain["metadata"]["labels"]) & {
        pods.QUEUE_LABEL,
        pods.PRIORITY_LABEL,
    }
    pod = plain["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["template"]["spec"]
    assert (
        "priorityClassName" not in pod
        and "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    )
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    with_affinity = PROFILES["gpu"].model_copy(
        update={"node_affinity": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    )
    both = k8s.pytorchjob_manifest(
        k8s.NodeJob(
            "trainpipe-train-abc", ClusterJob(shared_pvc="x"), 2, 1, "/c", "/r", with_affinity, "img:1", max_restarts=1
        )
    )
    validate_pytorchjob(both)
    affinity = both["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["affinity"]
    assert set(affinity) == {"nodeAffinity", "podAntiAffinity"}  # a profile's node affinity stays beside the spread


def test_the_team_profile_reaches_the_kfp_pipelines_pods(tmp_path):
    from trainpipe.pipelines.compile import compile_pipeline, validate_pipeline_yaml

    path = compile_pipeline(tmp_path / "team.yaml", TEAM)
    validate_pipeline_yaml(path)
    executors = list(yaml.safe_load_all(path.read_text()))[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert len(executors) >= 7
    for name, ex in executors.items():
        labels = ex.get("podMetadata", {}).get("labels", {})
        assert labels.get(pods.QUEUE_LABEL) == "training" and labels.get(pods.PRIORITY_LABEL) == "training-high", name


def test_the_team_profile_reaches_airflows_pods(tmp_path):
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(yaml.safe_dump({"data": "s3://bucket/raw.csv", "profile": TEAM}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "offline",
                "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "nobody"}}],
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
        "KUBECONFIG": str(kubeconfig),
    }
    proc = subprocess.run(
        [sys.executable, "-c", POD_CHECK.format(path=str(REPO / "dags" / "training_dag.py"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task_id, pod in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        validate_pod(pod["spec"], pod["metadata"])
        assert pod["metadata"]["namespace"] == "team-a", task_id
        assert (
            pod["metadata"]["labels"][pods.QUEUE_LABEL] == "training"
            and pod["metadata"]["labels"][pods.PRIORITY_LABEL] == "training-high"
        )
        assert (
            pod["spec"]["priorityClassName"] == "training-high"
            and pod["spec"]["serviceAccountName"] == "team-a-pipelines"
        )
        # a training pod gets the profile's grace after SIGTERM: its ranks finish their step and write a checkpoint
        assert pod["spec"].get("terminationGracePeriodSeconds") == (
            get_profile(TEAM).termination_grace_s if task_id == "train_model" else None
        ), task_id
