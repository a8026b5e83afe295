"""Object storage under the platform's policy: an S3 remote and an MLflow artifact store on a
local S3-compatible server (moto's server mode on 127.0.0.1) with its region configured.

What is checked: objects land encrypted (the server reports the SSE header on every object),
data stays in the allowed locations and regions, plain http off loopback is refused, an
unreachable remote is a transient failure that records nothing, and the rerun completes
with the same hash.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import _free_port, _start_mlflow, result_of, run_component
from trainpipe.contract.artifacts import MARKER

pytestmark = pytest.mark.integration

REGION = "me-central-1"
KEY = "arn:aws:kms:me-central-1:000000000000:key/trainpipe-test"
CREDS = {"AWS_ACCESS_KEY_ID": "trainpipe-test-key", "AWS_SECRET_ACCESS_KEY": "trainpipe-test-secret-value"}
POLICY = {
    "allowed_regions": [REGION],
    "allowed_locations": ["s3://uae-data/dvc", "s3://uae-models/mlflow"],
    "require_encryption": True,
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 with two buckets in me-central-1; yields (endpoint, boto3 client)."""
    import boto3

    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2)
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto server did not start: " + log.read_text()[-2000:]) from None
            time.sleep(0.3)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
    )
    for bucket in ("uae-data", "uae-models", "eu-data"):
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    try:
        yield endpoint, client
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def validated(tmp_path_factory, tiny_csv):
    out = tmp_path_factory.mktemp("validated") / "v"
    result_of(
        run_component("validate_data", "--data", str(tiny_csv), "--output-dir", str(out), "--label-column", "target")
    )
    return out


def _objects(client, bucket, prefix=""):
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def _snapshot(tmp_path, validated, endpoint, *extra, policy=POLICY, out="s"):
    args = [
        "--data",
        str(validated),
        "--output-dir",
        str(tmp_path / out),
        "--repo-dir",
        str(tmp_path / "repo"),
        "--remote-region",
        REGION,
        "--remote-endpoint-url",
        endpoint,
        *extra,
    ]
    if "--remote-url" not in extra:
        args += ["--remote-url", "s3://uae-data/dvc"]
    return run_component("snapshot_dataset", *args, env={**CREDS, "TRAINPIPE_POLICY": json.dumps(policy)})


def test_snapshot_to_s3_is_encrypted_with_the_configured_key_in_region(tmp_path, validated, s3):
    endpoint, client = s3
    r = result_of(_snapshot(tmp_path, validated, endpoint, "--remote-sse", "aws:kms", "--remote-sse-kms-key-id", KEY))
    from trainpipe.contract.io import file_digest

    assert (
        r["md5"] == file_digest(validated / "tiny.csv") and r["pushed"] == 1 and r["remote_url"] == "s3://uae-data/dvc"
    )
    keys = _objects(client, "uae-data", "dvc/")
    assert keys == [f"dvc/files/md5/{r['md5'][:2]}/{r['md5'][2:]}"]
    for key in keys:
        head = client.head_object(Bucket="uae-data", Key=key)
        assert head["ServerSideEncryption"] == "aws:kms" and head["SSEKMSKeyId"] == KEY
    assert client.get_bucket_location(Bucket="uae-data")["LocationConstraint"] == REGION
    config = (tmp_path / "repo" / ".dvc" / "config").read_text()
    assert "region = me-central-1" in config and "sse = aws:kms" in config
    assert CREDS["AWS_SECRET_ACCESS_KEY"] not in config and CREDS["AWS_ACCESS_KEY_ID"] not in config


@pytest.mark.parametrize(
    "extra,policy,needle",
    [
        (
            ["--remote-sse", "AES256", "--remote-url", "s3://eu-data/dvc"],
            POLICY,
            "remote_url: 's3://eu-data/dvc' is outside the policy's allowed_locations",
        ),
        (
            ["--remote-sse", "AES256", "--remote-region", "eu-central-1"],
            POLICY,
            "remote_url: region 'eu-central-1' of 's3://uae-data/dvc' is not allowed",
        ),
        ([], POLICY, "remote_sse: 's3://uae-data/dvc' would be written unencrypted"),
        (["--remote-sse", "aws:kms"], POLICY, "remote_sse_kms_key_id: aws:kms encryption needs a key id"),
        (
            ["--remote-sse", "AES256", "--remote-endpoint-url", "http://10.20.30.40:9000"],
            {},
            "remote_endpoint_url: plain http:// to '10.20.30.40' is refused",
        ),
        (["--remote-url", "ftp://files.example.com/dvc"], {}, "remote_url: unsupported URI scheme 'ftp://'"),
    ],
    ids=["location", "region", "unencrypted", "kms-without-key", "plain-http", "scheme"],
)
def test_snapshot_outside_the_policy_is_refused_before_anything_is_written(
    tmp_path, validated, s3, extra, policy, needle
):
    endpoint, client = s3
    before = {b: _objects(client, b) for b in ("uae-data", "eu-data")}
    proc = _snapshot(tmp_path, validated, endpoint, *extra, policy=policy)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert needle in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "s" / MARKER).exists() and not (tmp_path / "repo").exists()
    assert {b: _objects(client, b) for b in ("uae-data", "eu-data")} == before


def test_unreachable_remote_is_transient_records_nothing_and_the_rerun_completes(tmp_path, validated, s3):
    endpoint, client = s3
    dead = f"http://127.0.0.1:{_free_port()}"
    proc = _snapshot(tmp_path, validated, dead, "--remote-sse", "AES256", "--remote-url", "s3://uae-data/dvc/retry")
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert (
        "remote_url: pushing to DVC remote 's3://uae-data/dvc/retry' failed: Could not connect"
        in proc.stderr.strip().splitlines()[-1]
    )
    assert not (tmp_path / "s" / MARKER).exists()
    # nothing recorded as done: the workspace has no commit naming data the remote lacks
    log = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "rev-parse", "--verify", "HEAD"], capture_output=True, text=True
    )
    assert log.returncode != 0
    assert _objects(client, "uae-data", "dvc/retry/") == []
    r = result_of(
        _snapshot(tmp_path, validated, endpoint, "--remote-sse", "AES256", "--remote-url", "s3://uae-data/dvc/retry")
    )
    from trainpipe.contract.io import file_digest

    assert r["md5"] == file_digest(validated / "tiny.csv") and r["committed"] and r["pushed"] == 1
    again = result_of(
        _snapshot(
            tmp_path, validated, endpoint, "--remote-sse", "AES256", "--remote-url", "s3://uae-data/dvc/retry", out="s2"
        )
    )
    assert again["md5"] == r["md5"] and again["rev"] == r["rev"] and not again["committed"] and again["pushed"] == 0
    assert [
        client.head_object(Bucket="uae-data", Key=k)["ServerSideEncryption"]
        for k in _objects(client, "uae-data", "dvc/retry/")
    ] == ["AES256"]


@pytest.fixture(scope="module")
def mlflow_on_s3(tmp_path_factory, s3):
    endpoint, _ = s3
    root = tmp_path_factory.mktemp("mlflow-s3")
    env = {**CREDS, "MLFLOW_S3_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": REGION}
    gen = _start_mlflow(
        root,
        f"sqlite:///{root / 'mlflow.db'}",
        args=("--default-artifact-root", "s3://uae-models/mlflow", "--no-serve-artifacts"),
        env=env,
    )
    uri = next(gen)
    yield uri, env
    gen.close()


def test_mlflow_artifacts_on_s3_are_encrypted_and_kept_in_the_allowed_store(tmp_path, tiny_csv, s3, mlflow_on_s3):
    """Slow on purpose (about a minute): a real training logs its model through an MLflow server whose artifacts
    live in an S3 bucket (moto's server), since the encryption and the store are checked on the objects it wrote."""
    _, client = s3
    uri, env = mlflow_on_s3
    policy = {**POLICY, "sse": "AES256"}
    args = [
        "--data",
        str(tiny_csv),
        "--label-column",
        "target",
        "--tracking-uri",
        uri,
        "--nproc-per-node",
        "1",
        "--epochs",
        "1",
        "--batch-size",
        "32",
    ]
    r = result_of(
        run_component(
            "train_model",
            *args,
            "--output-dir",
            str(tmp_path / "m"),
            env={**env, "TRAINPIPE_POLICY": json.dumps(policy)},
        )
    )
    keys = _objects(client, "uae-models", "mlflow/")
    assert any(k.endswith(f"{r['mlflow_run_id']}/artifacts/train_model/metrics.jsonl") for k in keys), keys
    assert {client.head_object(Bucket="uae-models", Key=k).get("ServerSideEncryption") for k in keys} == {"AES256"}

    # the same store outside the allowed locations: refused before any run is created
    import mlflow

    runs_before = len(
        mlflow.MlflowClient(uri).search_runs(
            [mlflow.MlflowClient(uri).get_experiment_by_name("trainpipe").experiment_id]
        )
    )
    narrow = {**policy, "allowed_locations": ["s3://uae-data/dvc"]}
    proc = run_component(
        "train_model", *args, "--output-dir", str(tmp_path / "m2"), env={**env, "TRAINPIPE_POLICY": json.dumps(narrow)}
    )
    assert proc.returncode == 2 and "artifact store: 's3://uae-models/mlflow/" in proc.stderr.strip().splitlines()[-1]
    assert "outside the policy's allowed_locations" in proc.stderr.strip().splitlines()[-1]
    assert (
        len(
            mlflow.MlflowClient(uri).search_runs(
                [mlflow.MlflowClient(uri).get_experiment_by_name("trainpipe").experiment_id]
            )
        )
        == runs_before
    )
    # and with encryption required but none configured, nothing is uploaded
    proc = run_component(
        "train_model", *args, "--output-dir", str(tmp_path / "m3"), env={**env, "TRAINPIPE_POLICY": json.dumps(POLICY)}
    )
    assert proc.returncode == 2 and "would be written unencrypted" in proc.stderr.strip().splitlines()[-1]
    assert len(_objects(client, "uae-models", "mlflow/")) == len(keys)
