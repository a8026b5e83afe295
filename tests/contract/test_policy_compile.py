"""The policy at compile and submit time: what can be known before anything runs is refused there."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.contract

POLICY = (
    "allowed_regions: [me-central-1]\nallowed_locations: ['s3://uae-pipelines', 's3://uae-data']\n"
    "require_encryption: true\nsse: aws:kms\nsse_kms_key_id: alias/uae\n"
)


def _cli(*args, env=None):
    import os

    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_compiled_pipeline_carries_the_policy_to_every_task_and_its_root(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    out = tmp_path / "p.yaml"
    proc = _cli(
        "compile",
        "-o",
        str(out),
        "--policy",
        str(policy),
        "--pipeline-root",
        "s3://uae-pipelines/runs",
        env={"AWS_REGION": "me-central-1"},
    )
    assert proc.returncode == 0, proc.stderr
    from trainpipe.pipelines.compile import validate_pipeline_yaml

    validate_pipeline_yaml(out)
    spec = next(yaml.safe_load_all(out.read_text()))
    assert spec["defaultPipelineRoot"] == "s3://uae-pipelines/runs"
    executors = [
        ex for ex in spec["deploymentSpec"]["executors"].values() if "container" in ex
    ]  # the importer has none
    assert len(executors) == 7  # the reference pipeline's steps with its optional ones (tune, optimize) off
    for ex in executors:
        env = {e["name"]: e["value"] for e in ex["container"].get("env", [])}
        assert json.loads(env["TRAINPIPE_POLICY"])["allowed_regions"] == ["me-central-1"]


@pytest.mark.parametrize(
    "root,region,needle",
    [
        (
            "s3://eu-pipelines/runs",
            "me-central-1",
            "pipeline_root: 's3://eu-pipelines/runs' is outside the policy's allowed_locations",
        ),
        ("s3://uae-pipelines/runs", "eu-west-1", "pipeline_root: region 'eu-west-1'"),
        ("gs://uae-pipelines/runs", "me-central-1", "outside the policy's allowed_locations"),
    ],
)
def test_pipeline_root_outside_the_policy_is_refused_at_compile_time(tmp_path, root, region, needle):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    proc = _cli(
        "compile",
        "-o",
        str(tmp_path / "p.yaml"),
        "--policy",
        str(policy),
        "--pipeline-root",
        root,
        env={"AWS_REGION": region},
    )
    assert proc.returncode == 2 and needle in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_run_refuses_a_config_outside_its_policy_before_any_step(tmp_path):
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": str(tmp_path / "d.csv"),
                "workspace": str(tmp_path / "ws"),
                "dvc_remote_url": "s3://eu-data/dvc",
                "policy": {"allowed_regions": ["me-central-1"], "allowed_locations": ["s3://uae-data", str(tmp_path)]},
            }
        )
    )
    proc = _cli("run", "--config", str(config), env={"AWS_REGION": "me-central-1"})
    assert (
        proc.returncode == 2 and "dvc_remote_url: 's3://eu-data/dvc' is outside" in proc.stderr.strip().splitlines()[-1]
    )
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["upload", "--host", "http://kfp.example.com", "--package", "pipelines/golden/pipeline-cpu.yaml"],
        ["schedule", "--host", "http://kfp.example.com", "--cron", "0 3 * * *"],
    ],
)
def test_plain_http_kfp_host_off_loopback_is_refused(tmp_path, command):
    proc = _cli(*command)
    assert proc.returncode == 2 and "host: plain http:// to 'kfp.example.com' is refused" in proc.stderr
