"""monitoring/: the PodMonitor validated offline with the validators generated from
prometheus-operator's CRDs, the training pods it selects, and the Grafana dashboards' queries
naming only series trainpipe serves (tests/integration/test_telemetry.py runs every query against
a real Prometheus)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.helpers.k8s_schema import validate_pytorchjob, validate_trainjob
from trainpipe.components.train_model import k8s
from trainpipe.components.train_model.spec import ClusterJob
from trainpipe.contract import push
from trainpipe.services import pods, telemetry
from trainpipe.services.profiles import PROFILES, metrics_port

pytestmark = pytest.mark.contract

PODMONITOR = REPO / "monitoring" / "podmonitor.yaml"
NPM = Path(os.environ.get("NPM_PREFIX", Path.home() / ".cache" / "trainpipe" / "npm"))
CHECK = """
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { readFileSync } from "node:fs";
try { new PodMonitor(JSON.parse(readFileSync(0, "utf8"))).validate(); console.log("valid"); }
catch (e) { console.log("invalid: " + e.message); process.exit(1); }
"""


def _validate(obj: dict) -> subprocess.CompletedProcess:
    models = NPM / "node_modules" / "@kubernetes-models" / "prometheus-operator"
    if not models.is_dir() or shutil.which("node") is None:
        if os.environ.get("CI"):
            pytest.fail(f"the PodMonitor validators are not installed at {models} (make monitoring)")
        pytest.skip("make monitoring installs the PodMonitor validators")
    script = NPM / "check-podmonitor.mjs"
    script.write_text(CHECK)
    return subprocess.run(
        ["node", str(script)], input=json.dumps(obj), capture_output=True, text=True, timeout=60, check=False
    )


def test_the_podmonitor_validates_and_a_broken_one_is_refused():
    monitor = yaml.safe_load(PODMONITOR.read_text())
    ok = _validate(monitor)
    assert ok.returncode == 0 and ok.stdout.strip() == "valid", ok.stdout + ok.stderr
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["podMetricsEndpoints"][0]["interval"] = "every minute"
    broken["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "discard"
    bad = _validate(broken)
    assert (
        bad.returncode == 1
        and "interval must match pattern" in bad.stdout
        and "action must be equal to one of" in bad.stdout
    )


def test_the_podmonitor_selects_the_training_pods_and_reads_their_port_annotation():
    spec = yaml.safe_load(PODMONITOR.read_text())["spec"]
    labels, annotations = pods.metrics_metadata(9450)
    assert spec["selector"]["matchLabels"] == labels
    relabel = spec["podMetricsEndpoints"][0]["relabelings"]
    keep = next(r for r in relabel if r["action"] == "keep")
    assert all(re.fullmatch(keep["regex"], name) for name in pods.MAIN_CONTAINERS)
    assert not re.fullmatch(keep["regex"], "airflow-xcom-sidecar") and not re.fullmatch(keep["regex"], "kfp-launcher")
    address = next(r for r in relabel if r.get("targetLabel") == "__address__")
    assert (
        address["sourceLabels"][1] == "__meta_kubernetes_pod_annotation_prometheus_io_port"
        and "prometheus.io/port" in annotations
    )
    joined = ";".join(["10.0.0.7", annotations["prometheus.io/port"]])
    assert re.sub(f"^(?:{address['regex']})$", address["replacement"].replace("$", "\\"), joined) == "10.0.0.7:9450"
    assert pods.metrics_metadata(0) == ({}, {})  # a profile that turns metrics off gets neither


def test_trainjob_and_pytorchjob_pods_carry_the_label_and_validate():
    cluster = ClusterJob(shared_pvc="team-a-train", namespace="team-a")
    image = "registry.example/trainpipe@sha256:" + "0" * 64
    tj = k8s.trainjob_manifest(
        k8s.NodeJob(
            "trainpipe-train-abc",
            cluster,
            2,
            4,
            "/m/j/train.json",
            "/m/j/result.json",
            PROFILES["gpu"],
            image,
            metrics_port=9450,
        )
    )
    validate_trainjob(tj)
    meta = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"
    ]["template"]["metadata"]
    assert meta["labels"][pods.METRICS_LABEL] == "true" and meta["annotations"]["prometheus.io/port"] == "9450"
    pj = k8s.pytorchjob_manifest(
        k8s.NodeJob(
            "trainpipe-train-abc",
            cluster,
            2,
            4,
            "/m/j/train.json",
            "/m/j/result.json",
            PROFILES["cpu"],
            image,
            3,
            metrics_port=9450,
        )
    )
    validate_pytorchjob(pj)
    for replica in pj["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["metadata"]["labels"][pods.METRICS_LABEL] == "true"
    off = k8s.pytorchjob_manifest(
        k8s.NodeJob(
            "trainpipe-train-abc", cluster, 2, 4, "/m/j/train.json", "/m/j/result.json", PROFILES["cpu"], image, 3
        )
    )
    assert pods.METRICS_LABEL not in off["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]


def test_the_compiled_pipeline_labels_only_the_training_pod():
    for golden in ("pipeline-cpu.yaml", "pipeline-gpu.yaml"):
        docs = list(yaml.safe_load_all((REPO / "pipelines" / "golden" / golden).read_text()))
        executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        labelled = {
            name
            for name, ex in executors.items()
            if ex.get("podMetadata", {}).get("labels", {}).get(pods.METRICS_LABEL) == "true"
        }
        assert labelled == {"exec-train-model"}, (golden, labelled)
        assert executors["exec-train-model"]["podMetadata"]["annotations"]["prometheus.io/port"] == str(
            PROFILES["cpu"].metrics_port
        )


def test_a_local_run_serves_nothing_unless_asked_and_the_cluster_profiles_do():
    assert metrics_port("local") == 0 and metrics_port("no-such-profile.yaml") == 0
    assert metrics_port("cpu") == metrics_port("gpu") == 9450


def _exprs(path: Path) -> list[tuple[str, str]]:
    dashboard = json.loads(path.read_text())
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def test_the_dashboards_query_only_series_trainpipe_serves_and_take_a_run():
    source = Path(telemetry.__file__).read_text() + Path(push.__file__).read_text()  # served, pushed
    served = set(re.findall(r'"(trainpipe_[a-z_]+)"', source))
    paths = sorted((REPO / "monitoring" / "grafana").glob("*.json"))
    assert [p.name for p in paths] == ["trainpipe-pipeline.json", "trainpipe-training.json"]
    uids = set()
    for path in paths:
        dashboard = json.loads(path.read_text())
        uids.add(dashboard["uid"])
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["run_id"]["query"]["query"].startswith(
            "label_values("
        )
        for title, expr in _exprs(path):
            assert "$run_id" in expr, (path.name, title)
            for name in re.findall(r"\btrainpipe_[a-z_]+", expr):
                base = re.sub(r"_(total|bucket|sum|count)$", "", name)
                assert name in served or base in served, (
                    f"{path.name} / {title}: {name} is not a series trainpipe serves"
                )
    assert len(uids) == 2
