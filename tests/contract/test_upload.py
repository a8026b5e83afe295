"""`trainpipe upload` and `trainpipe schedule` against a local HTTP server standing in for
the KFP API server (none can run here): it checks the requests kfp.Client sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.contract


class FakeKFP:
    def __init__(self) -> None:
        self.pipelines: dict[str, str] = {}
        self.versions: dict[str, list[dict]] = {}
        self.requests: list[dict] = []
        self.recurring: list[dict] = []


def _handler(state: FakeKFP):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: bytes = b"") -> dict:
            url = urlparse(self.path)
            req = {
                "method": self.command,
                "path": url.path,
                "query": parse_qs(url.query),
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
            state.requests.append(req)
            return req

        def do_GET(self):
            req = self._record()
            path, q = req["path"], req["query"]
            if path == "/apis/v2beta1/healthz":
                return self._send(200, {"multi_user": False})
            if path == "/apis/v2beta1/pipelines":
                wanted = json.loads(q["filter"][0])["predicates"][0]["stringValue"] if "filter" in q else None
                found = [{"pipeline_id": pid, "display_name": n} for n, pid in state.pipelines.items() if n == wanted]
                return self._send(200, {"pipelines": found, "total_size": len(found)} if found else {})
            if path.startswith("/apis/v2beta1/pipelines/") and path.endswith("/versions"):
                pid = path.split("/")[4]
                return self._send(
                    200,
                    {
                        "pipeline_versions": list(reversed(state.versions.get(pid, []))),
                        "total_size": len(state.versions.get(pid, [])),
                    },
                )
            if path == "/apis/v2beta1/experiments":
                return self._send(200, {})
            return self._send(404, {"error": "not found"})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = self._record(body)
            path, q = req["path"], req["query"]
            if path == "/apis/v2beta1/pipelines":
                doc = json.loads(body)
                pid = f"p-{len(state.pipelines) + 1}"
                state.pipelines[doc["display_name"]] = pid
                return self._send(200, {"pipeline_id": pid, "display_name": doc["display_name"]})
            if path == "/apis/v2beta1/pipelines/upload_version":
                msg = BytesParser(policy=email_policy).parsebytes(
                    b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
                )
                files = {
                    part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                    for part in msg.iter_parts()
                }
                req["uploadfile"] = files.get("uploadfile")
                pid, name = q["pipelineid"][0], q["name"][0]
                if any(v["display_name"] == name for v in state.versions.get(pid, [])):
                    return self._send(409, {"error": f"version {name} already exists", "code": 6})
                v = {
                    "pipeline_id": pid,
                    "pipeline_version_id": f"v-{sum(map(len, state.versions.values())) + 1}",
                    "display_name": name,
                }
                state.versions.setdefault(pid, []).append(v)
                return self._send(200, v)
            if path == "/apis/v2beta1/experiments":
                return self._send(200, {"experiment_id": "e-1", "display_name": json.loads(body)["display_name"]})
            if path == "/apis/v2beta1/recurringruns":
                doc = json.loads(body)
                state.recurring.append(doc)
                return self._send(200, {**doc, "recurring_run_id": "r-1"})
            return self._send(404, {"error": "not found"})

    return Handler


@pytest.fixture()
def kfp_api():
    state = FakeKFP()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_upload_creates_the_pipeline_then_new_versions(kfp_api, tmp_path):
    host, state = kfp_api
    package = REPO / "pipelines" / "golden" / "pipeline-cpu.yaml"
    env = {"KFP_EXISTING_TOKEN": "t0k3n-from-env"}
    first = _cli(
        "upload",
        "--host",
        host,
        "--package",
        str(package),
        "--pipeline-name",
        "team-training",
        "--version",
        "v1",
        env=env,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads(first.stdout) == {"created": "true", "pipeline_id": "p-1", "version": "v1", "version_id": "v-1"}
    create = next(r for r in state.requests if r["path"] == "/apis/v2beta1/pipelines" and r["method"] == "POST")
    assert json.loads(create["body"])["display_name"] == "team-training"
    up = next(r for r in state.requests if r["path"] == "/apis/v2beta1/pipelines/upload_version")
    assert up["query"]["name"] == ["v1"] and up["query"]["pipelineid"] == ["p-1"]
    assert up["uploadfile"] == package.read_bytes()
    assert all(r["auth"] == "Bearer t0k3n-from-env" for r in state.requests if r["path"] != "/apis/v2beta1/healthz")

    second = _cli(
        "upload",
        "--host",
        host,
        "--package",
        str(package),
        "--pipeline-name",
        "team-training",
        "--version",
        "v2",
        env=env,
    )
    assert json.loads(second.stdout) == {"created": "false", "pipeline_id": "p-1", "version": "v2", "version_id": "v-2"}
    assert [(r["method"], r["path"]) for r in state.requests].count(("POST", "/apis/v2beta1/pipelines")) == 1

    again = _cli(
        "upload",
        "--host",
        host,
        "--package",
        str(package),
        "--pipeline-name",
        "team-training",
        "--version",
        "v2",
        env=env,
    )
    assert again.returncode == 2 and again.stderr.strip().splitlines()[-1] == (
        "trainpipe: error: version: 'v2' already exists for pipeline 'team-training'; pass another --version"
    )


def test_upload_refuses_a_missing_or_invalid_package_before_any_request(kfp_api, tmp_path):
    host, state = kfp_api
    proc = _cli("upload", "--host", host, "--package", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "package:" in proc.stderr and "does not exist" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelineInfo: {name: x}\nnotAField: 1\n")
    proc = _cli("upload", "--host", host, "--package", str(bad))
    assert proc.returncode == 2 and "not a valid KFP pipeline spec" in proc.stderr
    assert state.requests == []


def test_schedule_creates_a_recurring_run_of_the_newest_version(kfp_api, tmp_path):
    host, state = kfp_api
    package = REPO / "pipelines" / "golden" / "pipeline-cpu.yaml"
    assert _cli("upload", "--host", host, "--package", str(package), "--version", "v1").returncode == 0
    assert _cli("upload", "--host", host, "--package", str(package), "--version", "v2").returncode == 0
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: s3://bucket/raw/digits.csv\nlabel_column: label\ntracking_uri: https://mlflow.example.com\n")
    proc = _cli(
        "schedule", "--host", host, "--cron", "0 3 * * *", "--config", str(cfg), "--service-account", "team-a-runner"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["cron"] == "0 0 3 * * *"
    (run,) = state.recurring
    assert run["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    assert run["pipeline_version_reference"] == {"pipeline_id": "p-1", "pipeline_version_id": "v-2"}
    assert run["runtime_config"]["parameters"]["data"] == "s3://bucket/raw/digits.csv"
    assert run["max_concurrency"] in ("1", 1) and run["display_name"] == "trainpipe-training-schedule"
    assert "https://mlflow.example.com" == run["runtime_config"]["parameters"]["tracking_uri"]
    assert run["service_account"] == "team-a-runner"  # every pod of each run runs under it


def test_schedule_without_caching_submits_the_package_with_caching_off(kfp_api, tmp_path):
    host, state = kfp_api
    package = REPO / "pipelines" / "golden" / "pipeline-cpu.yaml"
    refused = _cli("schedule", "--host", host, "--cron", "0 3 * * *", "--no-caching")
    assert refused.returncode == 2 and "caching: switching caching off for a schedule needs --package" in refused.stderr
    proc = _cli("schedule", "--host", host, "--cron", "0 3 * * *", "--no-caching", "--package", str(package))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = state.recurring
    spec = run["pipeline_spec"]
    spec = spec.get("pipeline_spec", spec)  # with a platform spec, kfp nests the two
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks and all(not t.get("cachingOptions", {}).get("enableCache") for t in tasks.values())


def test_schedule_rejects_a_bad_cron_in_one_line(kfp_api):
    host, _ = kfp_api
    proc = _cli("schedule", "--host", host, "--cron", "every day")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "trainpipe: error: cron: 'every day'"
    )
