"""Multi-node launch: torchrun/TF_CONFIG settings from the environment, and the TrainJob /
PyTorchJob manifests validated offline against their published schemas. No cluster runs
here: submission is exercised against a stand-in for the Kubernetes API."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from tests.helpers.k8s_schema import validate_pytorchjob, validate_trainjob
from trainpipe.components.train_model import k8s
from trainpipe.components.train_model.spec import ClusterJob, TrainModelConfig
from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.contract.lineage import Lineage, OrchestratorLineage, SnapshotLineage
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import Runtime
from trainpipe.services.profiles import PROFILES, HardwareProfile, Resources
from trainpipe.training import launch

pytestmark = pytest.mark.contract

CLUSTER = ClusterJob(shared_pvc="team-a-train", namespace="team-a")


def _cfg(tmp_path: Path, **kw) -> TrainModelConfig:
    return TrainModelConfig(data=str(tmp_path / "d.csv"), output_dir=str(tmp_path / "out"), **kw)


def test_multi_node_torchrun_takes_node_rank_and_endpoint_from_the_trainer_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PET_NODE_RANK", "2")
    monkeypatch.setenv("PET_MASTER_ADDR", "job-node-0-0.job")
    monkeypatch.setenv("PET_MASTER_PORT", "29400")
    cmd = launch.torchrun_command(_cfg(tmp_path, nnodes=4, nproc_per_node=8, batch_size=64), Path("c.json"))
    assert "--nnodes=4" in cmd and "--node-rank=2" in cmd and "--nproc-per-node=8" in cmd
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=job-node-0-0.job:29400" in cmd
    assert "--standalone" not in cmd and "--max-restarts=3" in cmd
    # one node: trainpipe starts the ranks with torchrun's environment, a fresh store file each start
    plan = launch.torch_plan(_cfg(tmp_path, nproc_per_node=2, batch_size=64), Path("c.json"), {})
    assert [e["RANK"] for e in plan.envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in plan.envs} == {"2"}
    first, second = plan.per_attempt(), plan.per_attempt()
    assert (
        plan.restarts == 3
        and first[0] == first[1]
        and first[0]["TRAINPIPE_STORE_FILE"] != second[0]["TRAINPIPE_STORE_FILE"]
    )


def test_multi_node_without_a_rendezvous_is_a_one_line_input_error(tmp_path, monkeypatch):
    for var in ("MASTER_ADDR", "PET_MASTER_ADDR", "NODE_RANK", "PET_NODE_RANK", "RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = _cfg(tmp_path, nnodes=2, node_rank=1)
    with pytest.raises(InputError, match="rdzv_endpoint: nnodes > 1 needs"):
        launch.torchrun_command(cfg, Path("c.json"))
    with pytest.raises(InputError, match="node_rank: not set"):
        launch.node_rank(_cfg(tmp_path, nnodes=2))


def test_tf_config_is_generated_locally_and_checked_when_given(tmp_path, monkeypatch):
    envs = launch.tf_worker_envs(_cfg(tmp_path, backend="tensorflow", nproc_per_node=2))
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    assert launch.tf_worker_envs(_cfg(tmp_path, backend="tensorflow", nproc_per_node=1, batch_size=64)) == [{}]
    # a restarted group gets fresh worker ports, never the failed cluster's
    plan = launch.tensorflow_plan(_cfg(tmp_path, backend="tensorflow", nproc_per_node=2), Path("c.json"), {})
    first, second = ([json.loads(e["TF_CONFIG"]) for e in plan.per_attempt()] for _ in range(2))
    assert [c["task"]["index"] for c in first] == [0, 1] and first[0]["cluster"] == first[1]["cluster"]
    assert first[0]["cluster"]["worker"] != second[0]["cluster"]["worker"]
    multi = _cfg(tmp_path, backend="tensorflow", nnodes=3, nproc_per_node=1, batch_size=63)
    with pytest.raises(InputError, match="TF_CONFIG: backend tensorflow with nnodes > 1"):
        launch.tf_worker_envs(multi)
    monkeypatch.setenv("TF_CONFIG", json.dumps(launch.tf_config(["a:1", "b:1"], 0)))
    with pytest.raises(InputError, match="lists 2 workers but nnodes is 3"):
        launch.tf_worker_envs(multi)


def _trainjob(profile: HardwareProfile) -> dict:
    return k8s.trainjob_manifest(
        k8s.NodeJob(
            "trainpipe-train-abc",
            CLUSTER,
            4,
            8,
            "/mnt/trainpipe/j/train.json",
            "/mnt/trainpipe/j/result.json",
            profile,
            "registry.example/trainpipe@sha256:" + "0" * 64,
        )
    )


def _pod_patch(manifest: dict) -> dict:
    return manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["template"]["spec"]


def test_gpu_trainjob_validates_and_puts_gpus_selectors_and_tolerations_where_kubernetes_expects_them():
    m = _trainjob(PROFILES["gpu"])
    validate_trainjob(m)
    trainer = m["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"
    assert trainer["command"] == ["python", "-m", "trainpipe.components.train_model"]
    pod = _pod_patch(m)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    assert c["volumeMounts"] == [{"name": "pvc-0", "mountPath": "/mnt/trainpipe"}]


def test_cpu_trainjob_and_a_mig_profile_validate():
    validate_trainjob(_trainjob(PROFILES["cpu"]))
    mig = HardwareProfile(name="mig", train=Resources(accelerator_type="nvidia.com/mig-1g.10gb", accelerator_count=2))
    m = _trainjob(mig)
    validate_trainjob(m)
    assert m["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/mig-1g.10gb"] == "2"
    assert "nvidia.com/gpu" not in m["spec"]["trainer"]["resourcesPerNode"]["limits"]


def test_gpu_pytorchjob_validates_with_one_master_and_the_rest_workers():
    m = k8s.pytorchjob_manifest(
        k8s.NodeJob("trainpipe-train-abc", CLUSTER, 3, 4, "/c", "/r", PROFILES["gpu"], "img:1", max_restarts=3)
    )
    validate_pytorchjob(m)
    specs = m["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    pod = specs["Worker"]["template"]["spec"]
    assert pod["containers"][0]["name"] == "pytorch"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert (
        pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    )
    assert m["spec"]["nprocPerNode"] == "4" and m["spec"]["runPolicy"]["backoffLimit"] == 3


def test_the_validators_reject_what_the_schemas_do_not_allow():
    bad = _trainjob(PROFILES["gpu"])
    bad["spec"]["trainer"]["gpus"] = 8
    with pytest.raises(AssertionError, match="unknown to the TrainJob schema"):
        validate_trainjob(bad)
    bad = k8s.pytorchjob_manifest(
        k8s.NodeJob("trainpipe-train-abc", CLUSTER, 2, 1, "/c", "/r", PROFILES["cpu"], "img:1", max_restarts=1)
    )
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["gpu"] = 1
    with pytest.raises(AssertionError, match="unknown to V1Container"):
        validate_pytorchjob(bad)
    bad = _trainjob(PROFILES["gpu"])
    _pod_patch(bad)["tolerations"] = [{"key": "x", "operator": "Exists", "effects": "NoSchedule"}]
    with pytest.raises(AssertionError, match="fields unknown to the TrainJob schema"):
        validate_trainjob(bad)


def test_an_invalid_job_name_is_refused():
    with pytest.raises(InputError, match="cluster.job_name"):
        k8s.trainjob_manifest(k8s.NodeJob("Bad_Name", CLUSTER, 2, 1, "/c", "/r", PROFILES["cpu"], "img:1"))


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"({status})")
        self.status = status


class StandInAPI:
    """Stands in for kubernetes.client.CustomObjectsApi: keeps the jobs it was given and plays node 0."""

    def __init__(self, outcome: str, polls_to_finish: int = 2):
        self.outcome, self.polls_to_finish = outcome, polls_to_finish
        self.jobs: dict[str, dict] = {}
        self.created: list[tuple] = []
        self.deleted: list[str] = []
        self.polls = 0

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        name = body["metadata"]["name"]
        if name in self.jobs:
            raise ApiError(409)
        self.jobs[name] = copy.deepcopy(body)
        self.created.append((group, version, namespace, plural, copy.deepcopy(body)))

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None):
        if self.jobs.pop(name, None) is None:
            raise ApiError(404)
        self.deleted.append(name)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.jobs:
            raise ApiError(404)
        body = self.jobs[name]
        if "status" in body:
            return body
        self.polls += 1
        if self.polls < self.polls_to_finish:
            return {"status": {"conditions": [{"type": "Created", "status": "True"}]}}
        if self.outcome == "Failed":
            return {"status": {"conditions": [{"type": "Failed", "status": "True"}]}}
        args = (
            body["spec"]["trainer"]["args"]
            if body["kind"] == "TrainJob"
            else body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
        )
        node_cfg = json.loads(Path(args[1]).read_text())
        model = Path(node_cfg["output_dir"])
        model.mkdir(parents=True, exist_ok=True)
        (model / "model.safetensors").write_bytes(b"weights")
        (model / "model.json").write_text("{}")
        result = {
            "model_file": "model.safetensors",
            "model_sha256": "ab",
            "mlflow_run_id": "r1",
            "tracking_uri": "http://mlflow",
            "experiment_id": "1",
            "train_function": "builtin:mlp",
            "task": "classification",
            "backend": "torch_ddp",
            "dist_backend": "nccl",
            "device": "cuda",
            "world_size": 8,
            "epochs": 1,
            "final_loss": 0.1,
            "metrics": {"loss": 0.1},
            "wall_seconds": 1.0,
            "resumed_from_step": 0,
            "global_steps": 10,
            "precision": "bf16",
            "classes": [0, 1],
            "feature_columns": ["a"],
            "lineage": {
                "training": {
                    "mlflow_run_id": "r1",
                    "experiment_id": "1",
                    "model_uri": "models:/m-1",
                    "train_function": "builtin:mlp",
                    "task": "classification",
                    "backend": "torch_ddp",
                    "dist_backend": "nccl",
                    "device": "cuda",
                    "world_size": 8,
                    "precision": "bf16",
                    "hardware_profile": "gpu",
                    "model_sha256": "ab",
                    "final_loss": 0.1,
                }
            },
        }
        Path(args[3]).write_text(json.dumps(result))
        return {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}


def _cluster_cfg(tmp_path: Path, **cluster_kw) -> TrainModelConfig:
    data = tmp_path / "d.csv"
    data.write_text("a,label\n1,0\n2,1\n")
    (tmp_path / "out").mkdir(exist_ok=True)
    cluster = ClusterJob(
        shared_pvc="pvc", mount_path=str(tmp_path / "shared"), image="img:1", poll_s=0.01, **cluster_kw
    )
    return _cfg(tmp_path, nnodes=2, nproc_per_node=4, batch_size=64, cluster=cluster)


def test_run_cluster_job_stages_submits_waits_and_brings_the_model_back(tmp_path):
    cfg = _cluster_cfg(tmp_path, job_name="trainpipe-train-t1")
    api = StandInAPI("Complete")
    snapshot = SnapshotLineage(md5="x", rev="r", path="data/d/d.csv", remote="/remote", repo="/repo")
    result = k8s.run_cluster_job(cfg, Lineage(snapshot=snapshot), Runtime(), api=api)
    group, version, ns, plural, body = api.created[0]
    assert (group, version, plural) == ("trainer.kubeflow.org", "v1alpha1", "trainjobs") and ns == "kubeflow"
    validate_trainjob(body)
    node_cfg = json.loads((tmp_path / "shared" / "trainpipe-train-t1" / "train.json").read_text())
    assert (
        node_cfg["data"].endswith("trainpipe-train-t1/data/d.csv")
        and node_cfg["nnodes"] == 2
        and "cluster" not in node_cfg
    )
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"weights"
    assert result.mlflow_run_id == "r1" and result.lineage.snapshot == snapshot
    assert result.lineage.training.cluster_job == "TrainJob/kubeflow/trainpipe-train-t1"


def test_a_failed_cluster_job_is_reported(tmp_path):
    cfg = _cluster_cfg(tmp_path, launcher="pytorchjob", job_name="trainpipe-train-t2")
    with pytest.raises(TrainpipeError, match="PyTorchJob kubeflow/trainpipe-train-t2 failed"):
        k8s.run_cluster_job(cfg, Lineage(), Runtime(), api=StandInAPI("Failed"))


def test_job_names_are_deterministic_per_run_and_step_and_a_retry_reattaches(tmp_path):
    lineage = Lineage(orchestrator=OrchestratorLineage(name="kfp", run_id="run-7"))
    assert k8s.job_name("run-7", str(tmp_path / "out")) == k8s.job_name("run-7", str(tmp_path / "out"))
    assert k8s.job_name("run-7", str(tmp_path / "out")) != k8s.job_name("run-8", str(tmp_path / "out"))
    assert k8s.job_name("run-7", str(tmp_path / "out")) != k8s.job_name("run-7", str(tmp_path / "other"))
    cfg = _cluster_cfg(tmp_path)
    api = StandInAPI("Complete", polls_to_finish=10**9)  # the first attempt's job never finishes while it waits
    first = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"timeout_s": 0.05})})
    name = k8s.job_name("run-7", cfg.output_dir)
    # the first attempt times out: its job is deleted, not left running
    with pytest.raises(TrainpipeError, match="did not finish within"):
        k8s.run_cluster_job(first, lineage, Runtime(), api=api)
    assert api.deleted == [name] and name not in api.jobs
    # a retry whose earlier attempt's job is still running reattaches instead of submitting a second job
    api = StandInAPI("Complete", polls_to_finish=3)
    api.create_namespaced_custom_object(
        "trainer.kubeflow.org",
        "v1alpha1",
        "kubeflow",
        "trainjobs",
        k8s.manifest_for(cfg, name, k8s.stage(cfg, name)[0]),
    )
    result = k8s.run_cluster_job(cfg, lineage, Runtime(), api=api)
    assert len(api.created) == 1 and result.lineage.training.cluster_job == f"TrainJob/kubeflow/{name}"
    # an earlier attempt's job that failed is deleted and started again under the same name
    api = StandInAPI("Complete")
    failed = k8s.manifest_for(cfg, name, k8s.stage(cfg, name)[0])
    failed["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    api.jobs[name] = failed
    k8s.run_cluster_job(cfg, lineage, Runtime(), api=api)
    assert api.deleted == [name] and [c[4]["metadata"]["name"] for c in api.created] == [name]


def test_a_killed_step_deletes_its_job(tmp_path):
    import os
    import signal
    import threading

    cfg = _cluster_cfg(tmp_path)
    api = StandInAPI("Complete", polls_to_finish=10**9)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(SystemExit) as stopped:
        k8s.run_cluster_job(cfg, Lineage(orchestrator=OrchestratorLineage(name="kfp", run_id="r")), Runtime(), api=api)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert api.deleted == [k8s.job_name("r", cfg.output_dir)] and not api.jobs


def test_job_pods_carry_the_whole_profile_and_the_policy(tmp_path):
    policy = Policy(require_encryption=True)
    profile = HardwareProfile(
        name="team",
        train=Resources(accelerator_type="nvidia.com/gpu", accelerator_count=1),
        node_selector={"pool": "gpu"},
        node_affinity=[{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["me-central-1a"]}],
        service_account="trainer",
        image_pull_secrets=["regcred"],
        secrets_as_env={"mlflow-credentials": {"password": "MLFLOW_TRACKING_PASSWORD"}},
    )
    from trainpipe.services.images import RUN_AS

    for launcher in ("trainjob", "pytorchjob"):
        cluster = CLUSTER.model_copy(update={"launcher": launcher})
        args = ("trainpipe-train-abc", cluster, 2, 1, "/c", "/r", profile, "img:1")
        m = (
            k8s.trainjob_manifest(k8s.NodeJob(*args, env=k8s._job_env(policy)))
            if launcher == "trainjob"
            else k8s.pytorchjob_manifest(k8s.NodeJob(*args, max_restarts=1, env=k8s._job_env(policy)))
        )
        (validate_trainjob if launcher == "trainjob" else validate_pytorchjob)(m)
        pod = (
            _pod_patch(m) if launcher == "trainjob" else m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        )
        assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["serviceAccountName"] == "trainer"
        assert (
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
                "matchExpressions"
            ][0]["key"]
            == "topology.kubernetes.io/zone"
        )
        assert pod["securityContext"]["runAsUser"] == RUN_AS
        env = pod["containers"][0]["env"] + (m["spec"]["trainer"]["env"] if launcher == "trainjob" else [])
        assert {
            "name": "MLFLOW_TRACKING_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "mlflow-credentials", "key": "password"}},
        } in env
        assert {"name": "TRAINPIPE_POLICY", "value": '{"require_encryption":true}'} in env


class DeletedMidway(StandInAPI):
    """Someone runs ``kubectl delete`` on the job while the step waits for it."""

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.polls += 1
        if self.polls >= 2:
            self.jobs.pop(name, None)
        return super().get_namespaced_custom_object(group, version, namespace, plural, name)


def test_a_job_deleted_from_outside_ends_the_step_with_its_own_code_at_once(tmp_path):
    """It used to be waited for until the step's timeout (a day), then read as an internal error."""
    from trainpipe.contract.errors import Cancelled

    cfg = _cluster_cfg(tmp_path, job_name="trainpipe-train-t9")
    t0 = time.monotonic()
    with pytest.raises(Cancelled, match=r"TrainJob kubeflow/trainpipe-train-t9 was deleted outside trainpipe") as exc:
        k8s.run_cluster_job(cfg, Lineage(), Runtime(), api=DeletedMidway("Complete", polls_to_finish=10**9))
    assert exc.value.exit_code == 8 and time.monotonic() - t0 < 5
