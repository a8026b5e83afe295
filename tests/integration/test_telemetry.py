"""Live telemetry against a real Prometheus and a real Pushgateway (Debian's binaries, started here
on free loopback ports, stopped by PID): training ranks scraped every second while they train,
the components' pushed figures, every query of the checked-in Grafana dashboards, and telemetry
that never fails a run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, _free_port, free_port_pair, make_snapshot, result_of, run_component, wait_http

pytestmark = pytest.mark.integration

DASHBOARDS = sorted((REPO / "monitoring" / "grafana").glob("*.json"))
#: What Grafana puts for $__rate_interval with a 1 s scrape interval (4 scrapes).
RATE_INTERVAL = "4s"


@dataclass
class Monitoring:
    prometheus: str
    pushgateway: str
    metrics_port: int

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        with urllib.request.urlopen(
            f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10
        ) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def query_range(self, promql: str, start: float, end: float) -> list[dict]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
        with urllib.request.urlopen(
            f"{self.prometheus}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=10
        ) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        params = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(f"{self.prometheus}/api/v1/label/{label}/values?{params}", timeout=10) as r:
            return json.load(r)["data"]

    def wait_for(self, promql: str, timeout: float = 20) -> list[dict]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.query(promql)
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no data for {promql} in {timeout:.0f} s")


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (make monitoring installs Debian's package)")
        pytest.skip(f"{name} is not installed (make monitoring)")
    return path


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory):
    """A Pushgateway and a Prometheus that scrapes it (honor_labels) and a training node's
    endpoint every second; both started by hand on 127.0.0.1 and stopped by PID."""
    root = tmp_path_factory.mktemp("monitoring")
    pg_port, prom_port, metrics_port = _free_port(), _free_port(), free_port_pair()
    pg = subprocess.Popen(
        [_binary("prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{pg_port}"],
        stdout=open(root / "pushgateway.log", "w"),
        stderr=subprocess.STDOUT,
    )
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "pushgateway",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{pg_port}"]}],
            },
            # rank 0's port alone, as the PodMonitor scrapes a pod: it answers for its node's ranks
            {"job_name": "trainpipe-training", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = subprocess.Popen(
        [
            _binary("prometheus"),
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=open(root / "prometheus.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{pg_port}/-/ready", pg, root / "pushgateway.log", 60)
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prom, root / "prometheus.log", 60)
        yield Monitoring(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{pg_port}", metrics_port)
    finally:
        _stop(prom)
        _stop(pg)


def _train_args(data: Path, out: Path, tracking: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainpipe.components.train_model",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--tracking-uri",
        tracking,
        "--label-column",
        "label",
        *extra,
    ]


def test_two_gloo_ranks_are_scraped_while_they_train_and_the_final_step_reaches_prometheus(
    monitoring, tmp_path, digits_csv, mlflow_server
):
    run_id = "live-two-ranks"
    env = {**os.environ, "TRAINPIPE_METRICS_ADDRESS": "127.0.0.1", "TRAINPIPE_PROGRESS_EVERY_S": "2"}
    proc = subprocess.Popen(
        _train_args(
            digits_csv,
            tmp_path / "out",
            mlflow_server,
            "--nproc-per-node",
            "2",
            "--epochs",
            "40",
            "--batch-size",
            "32",
            "--metrics-port",
            str(monitoring.metrics_port),
            "--run-id",
            run_id,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    live: list[dict] = []
    try:
        while proc.poll() is None and len(live) < 2:
            rates = monitoring.query(f'sum by (rank) (rate(trainpipe_training_samples_total{{run_id="{run_id}"}}[3s]))')
            live = [r for r in rates if float(r["value"][1]) > 0]
            time.sleep(0.5)
        assert proc.poll() is None, "training ended before Prometheus saw both ranks' samples/s"
        assert sorted(r["metric"]["rank"] for r in live) == ["0", "1"]
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    last = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    final = monitoring.query(f'last_over_time(trainpipe_training_global_step{{run_id="{run_id}"}}[5m])')
    assert {r["metric"]["rank"]: float(r["value"][1]) for r in final} == {"0": last["step"], "1": last["step"]}
    labels = final[0]["metric"]
    assert (
        labels["component"] == "train_model"
        and labels["model"] == "builtin:mlp"
        and labels["hardware_profile"] == "local"
        and labels["node"]
    )
    # the task log shows progress with rate and ETA at the set cadence, not per step
    progress = [line for line in err.splitlines() if " batches (" in line]
    assert progress and all("samples/s" in line and "elapsed" in line for line in progress), err[-2000:]
    assert any("ETA" in line for line in progress)
    steps = last["step"]
    assert len(progress) < steps / 10


def _run_pipeline(monitoring, tmp_path, data, tracking) -> None:
    cfg = {
        "data": str(data),
        "workspace": str(tmp_path / "ws"),
        "dataset_name": "digits",
        "model_name": "telemetry-digits",
        "tracking_uri": tracking,
        "thresholds": {"accuracy": 0.9},
        "train": {"nproc_per_node": 2, "epochs": 30, "batch_size": 32, "metrics_port": monitoring.metrics_port},
    }
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "TRAINPIPE_PUSHGATEWAY": monitoring.pushgateway, "TRAINPIPE_METRICS_ADDRESS": "127.0.0.1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainpipe.app.cli",
            "run",
            "--config",
            str(tmp_path / "pipeline.yaml"),
            "--engine",
            "kfp-local",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out += [panel] if panel.get("targets") else []
        out += [p for p in panel.get("panels", []) if p.get("targets")]
    return out


@pytest.mark.e2e
def test_every_dashboard_query_returns_data_after_a_pipeline_run(monitoring, tmp_path, digits_csv, mlflow_server):
    """Slow on purpose (about a minute): a whole pipeline runs against the real Prometheus and Pushgateway, since
    every Grafana query must return data from a real run's series, not from figures written by hand."""
    start = time.time()
    _run_pipeline(monitoring, tmp_path, digits_csv, mlflow_server)
    steps = {
        "validate_data",
        "snapshot_dataset",
        "detect_drift",
        "train_model",
        "profile_training",
        "evaluate_model",
        "register_model",
    }

    def scraped() -> tuple[str, set[str]] | None:
        """The run's id and the steps whose pushes Prometheus has scraped, once it has the last one."""
        training_runs = set(monitoring.label_values("run_id", "trainpipe_training_info"))
        pipeline_runs = set(monitoring.label_values("run_id", "trainpipe_component_duration_seconds"))
        ours = [r for r in training_runs & pipeline_runs if not r.startswith(("live-", "local-"))]
        if len(ours) != 1:
            return None
        query = f'trainpipe_component_success{{run_id="{ours[0]}"}}'
        pushed = {r["metric"]["component"] for r in monitoring.query(query)}
        return (ours[0], pushed) if pushed == steps else None

    deadline, found = time.time() + 120, None
    while found is None and time.time() < deadline:  # the Pushgateway's last push, scraped: an event, not a wait
        found = scraped()
        if found is None:
            time.sleep(0.5)
    assert found is not None, "Prometheus never scraped every step's push of one run"
    run_id = found[0]
    end = time.time()
    assert len(DASHBOARDS) == 2
    checked = 0
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "run_id")
        metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
        assert run_id in monitoring.label_values("run_id", metric), path.name
        for panel in _panels(dashboard):
            for target in panel["targets"]:
                promql = target["expr"].replace("$run_id", run_id).replace("$__rate_interval", RATE_INTERVAL)
                series = monitoring.query_range(promql, start, end)
                values = [float(v) for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if panel.get("description", "").startswith("CUDA only"):
                    assert values == [], f"{path.name} / {panel['title']}: GPU figures on a machine without CUDA"
                    continue  # NVML needs a GPU; the query is still valid PromQL (Prometheus answered success)
                assert values, f"{path.name} / {panel['title']}: no data for {promql}"
                checked += 1
    assert checked >= 20


def _pushed_groups(monitoring, component: str, run_id: str) -> list[dict]:
    with urllib.request.urlopen(f"{monitoring.pushgateway}/api/v1/metrics", timeout=10) as r:
        groups = json.load(r)["data"]
    return [g for g in groups if g["labels"].get("component") == component and g["labels"].get("run_id") == run_id]


def test_a_component_pushes_once_per_run_id_and_reruns_replace(monitoring, tmp_path, digits_csv):
    env = {"TRAINPIPE_PUSHGATEWAY": monitoring.pushgateway}
    for attempt in (1, 2):
        out = tmp_path / f"v{attempt}"
        proc = run_component(
            "validate_data",
            "--data",
            str(digits_csv),
            "--output-dir",
            str(out),
            "--label-column",
            "label",
            "--run-id",
            "rerun-1",
            env={**env, "TRAINPIPE_TRY_NUMBER": str(attempt)},
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(_pushed_groups(monitoring, "validate_data", "rerun-1")) == 1
    bad = run_component(
        "validate_data",
        "--data",
        str(tmp_path / "missing.csv"),
        "--output-dir",
        str(tmp_path / "bad"),
        "--run-id",
        "rerun-2",
        env=env,
    )
    assert bad.returncode == 2
    series = monitoring.wait_for('trainpipe_component_exit_code{component="validate_data", run_id="rerun-2"}')
    assert float(series[0]["value"][1]) == 2
    deadline = time.time() + 20
    while time.time() < deadline:
        retries = monitoring.query('trainpipe_component_retries{component="validate_data", run_id="rerun-1"}')
        if retries and float(retries[0]["value"][1]) == 1:
            break
        time.sleep(0.5)
    assert len(retries) == 1 and float(retries[0]["value"][1]) == 1, retries  # the second try replaced the first
    rows = monitoring.query('trainpipe_component_rows{component="validate_data", run_id="rerun-1"}')
    assert [float(r["value"][1]) for r in rows] == [1797.0]
    assert {r["metric"]["job"] for r in rows} == {"trainpipe"}


def test_detect_drift_pushes_its_decision_and_each_columns_statistic(monitoring, tmp_path, digits_csv):
    import pandas as pd

    frame = pd.read_csv(digits_csv)
    frame.assign(pixel_2_3=frame["pixel_2_3"] + 4).to_csv(tmp_path / "moved.csv", index=False)
    proc = run_component(
        "detect_drift",
        "--data",
        str(tmp_path / "moved.csv"),
        "--reference",
        str(digits_csv),
        "--output-dir",
        str(tmp_path / "d"),
        "--drift-share",
        "0.01",
        "--run-id",
        "drift-1",
        env={"TRAINPIPE_PUSHGATEWAY": monitoring.pushgateway},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    share = monitoring.wait_for('trainpipe_drift_share{component="detect_drift", run_id="drift-1"}')
    assert float(share[0]["value"][1]) == pytest.approx(1 / 65)
    assert float(monitoring.query('trainpipe_drift_retrain{run_id="drift-1"}')[0]["value"][1]) == 1
    drifted = monitoring.query('trainpipe_drift_column_drifted{run_id="drift-1"} == 1')
    assert [(d["metric"]["column"], d["metric"]["method"]) for d in drifted] == [("pixel_2_3", "wasserstein")]
    assert len(monitoring.query('trainpipe_drift_column_statistic{run_id="drift-1"}')) == 65


def test_a_taken_port_and_a_pushgateway_that_is_down_are_one_warning_each(tmp_path, digits_csv, mlflow_server):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    down = f"http://pusher:s3cret-token@127.0.0.1:{_free_port()}"
    try:
        proc = subprocess.run(
            _train_args(
                digits_csv,
                tmp_path / "out",
                mlflow_server,
                "--nproc-per-node",
                "1",
                "--epochs",
                "1",
                "--metrics-port",
                str(port),
            ),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "TRAINPIPE_METRICS_ADDRESS": "127.0.0.1", "TRAINPIPE_PUSHGATEWAY": down},
        )
    finally:
        taken.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "telemetry: warning" in line]
    assert len(warnings) == 2, warnings
    assert any(f"metrics_port: cannot serve rank 0's metrics on 127.0.0.1:{port}" in w for w in warnings)
    pushed = "TRAINPIPE_PUSHGATEWAY: cannot push train_model's figures to http://***@127.0.0.1:"
    assert any(pushed in w for w in warnings)
    assert "s3cret" not in proc.stderr and "Traceback" not in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (tmp_path / "out" / "model.safetensors").is_file() and result["global_steps"] > 0


def test_a_run_on_a_priced_profile_reports_what_it_used_and_cost_everywhere(
    monitoring, tmp_path, digits_csv, mlflow_server
):
    """Slow on purpose (about a minute: a snapshot, two trainings, a profile, an evaluation, a registration).
    A hardware profile with prices: train_model's result, its lineage, its MLflow run and the Pushgateway
    all carry the same usage and the same cost, which is the usage at those prices; profile_training gives
    it per epoch and per thousand samples, evaluate_model's report shows it, and the registered version
    carries it."""
    import mlflow

    from trainpipe.services.costs import Prices, Usage

    profile = tmp_path / "priced.yaml"
    profile.write_text(
        yaml.safe_dump({"name": "priced-cpu", "prices": {"currency": "EUR", "cpu_core_hour": 3.6, "node_hour": 0.36}})
    )
    run_id = f"priced-{time.time_ns()}"  # a series of its own: Prometheus keeps an earlier session's for minutes
    snapshot = make_snapshot(tmp_path / "data", digits_csv, "label")  # register_model wants the whole chain
    proc = run_component(
        "train_model",
        "--data",
        str(snapshot),
        "--output-dir",
        str(tmp_path / "t"),
        "--tracking-uri",
        mlflow_server,
        "--epochs",
        "2",
        "--nproc-per-node",
        "2",
        "--run-id",
        run_id,
        env={"TRAINPIPE_PUSHGATEWAY": monitoring.pushgateway, "TRAINPIPE_HARDWARE_PROFILE": str(profile)},
    )
    result = result_of(proc)
    usage = Usage(**result["usage"])
    assert usage.cpu_core_seconds > 1 and usage.gpu_seconds == 0 and usage.peak_memory_mb > 50
    assert result["currency"] == "EUR" and result["cost"] == usage.cost(
        Prices(currency="EUR", cpu_core_hour=3.6, node_hour=0.36)
    )
    assert result["cost"] == pytest.approx(usage.cpu_core_seconds / 1000 + usage.wall_seconds / 10_000, abs=1e-5)
    training = result["lineage"]["training"]
    assert (training["cost"], training["currency"], training["cpu_core_seconds"]) == (
        result["cost"],
        "EUR",
        usage.cpu_core_seconds,
    )
    run = mlflow.MlflowClient(mlflow_server).get_run(result["mlflow_run_id"])
    assert run.data.metrics["train_cost"] == result["cost"] and run.data.tags["trainpipe.cost_currency"] == "EUR"
    assert run.data.metrics["train_cpu_core_seconds"] == usage.cpu_core_seconds
    cost = monitoring.wait_for(f'trainpipe_run_cost{{component="train_model", run_id="{run_id}"}}')
    assert cost[0]["metric"]["currency"] == "EUR" and float(cost[0]["value"][1]) == pytest.approx(result["cost"])
    cpu = monitoring.query(f'trainpipe_run_cpu_core_seconds{{run_id="{run_id}"}}')
    assert float(cpu[0]["value"][1]) == pytest.approx(usage.cpu_core_seconds)
    # profile_training: the cost per epoch and per thousand samples; evaluate_model's report: what the model cost
    profiled = run_component(
        "profile_training",
        *("--model", str(tmp_path / "t"), "--output-dir", str(tmp_path / "p"), "--run-id", run_id),
        env={"TRAINPIPE_PUSHGATEWAY": monitoring.pushgateway},
    )
    prof = result_of(profiled)
    assert prof["cost"] == result["cost"] and prof["cost_per_epoch"] == pytest.approx(result["cost"] / 2, rel=1e-5)
    per_second = result["cost"] / usage.wall_seconds
    assert prof["cost_per_1k_samples"] == pytest.approx(per_second * 1000 / prof["samples_per_second"], rel=1e-4)
    assert "cost_per_1k_samples" in (tmp_path / "p" / "report.html").read_text()
    assert "EUR per 1,000 samples" in profiled.stderr
    assert prof["lineage"]["training_profile"]["cost_per_epoch"] == prof["cost_per_epoch"]
    per_k = monitoring.wait_for(
        f'trainpipe_profile_cost_per_1k_samples{{component="profile_training", run_id="{run_id}"}}'
    )
    assert float(per_k[0]["value"][1]) == pytest.approx(prof["cost_per_1k_samples"])
    result_of(
        run_component(
            "evaluate_model",
            *("--model", str(tmp_path / "t"), "--data", str(snapshot), "--output-dir", str(tmp_path / "e")),
        )
    )
    report = (tmp_path / "e" / "report.html").read_text()
    assert f"Training this model cost {result['cost']:.4f} EUR" in report
    # the version the gate let through carries what its training cost
    registered = result_of(
        run_component(
            "register_model",
            *(
                "--model",
                str(tmp_path / "t"),
                "--decision",
                str(tmp_path / "e"),
                "--training-profile",
                str(tmp_path / "p"),
            ),
            *("--tracking-uri", mlflow_server, "--model-name", "priced", "--output-dir", str(tmp_path / "r")),
        )
    )
    version = mlflow.MlflowClient(mlflow_server).get_model_version("priced", registered["version"])
    assert float(version.tags["lineage.training.cost"]) == result["cost"]
    assert version.tags["lineage.training.currency"] == "EUR"
    # an unpriced run reports its usage and no cost
    plain = result_of(
        run_component(
            "train_model",
            "--data",
            str(digits_csv),
            "--output-dir",
            str(tmp_path / "u"),
            "--tracking-uri",
            mlflow_server,
            "--epochs",
            "1",
        )
    )
    assert plain["cost"] is None and plain["usage"]["cpu_core_seconds"] > 0
    assert "cost" not in plain["lineage"]["training"]
