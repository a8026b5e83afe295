"""Signed models and approval before promotion, on a real MLflow server and the real OpenSSF
model-signing: register_model signs what the registry holds; one byte flipped in the artifact
store afterwards, and every loader of the model refuses it in one line (exit 7); with
require_approval register_model registers the challenger only, and `trainpipe promote` moves the
alias only for a version whose gate passed, audited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration

NAME = "signed-digits"
APPROVED = "approved-digits"


@pytest.fixture(scope="module")
def gov(tmp_path_factory, digits_csv, mlflow_server):
    """A snapshot, a key pair and the environment every step runs with: the signing key, the
    public key loaders verify with (so unsigned registered models are refused too), the audit log."""
    from trainpipe.services import signing

    root = tmp_path_factory.mktemp("gov")
    make_snapshot(root, digits_csv, label_column="label")
    signing.keypair(root / "signing.pem", root / "verify.pem")
    env = {
        signing.SIGNING_KEY_ENV: str(root / "signing.pem"),
        signing.VERIFY_KEY_ENV: str(root / "verify.pem"),
        "TRAINPIPE_AUDIT_LOG": str(root / "audit.jsonl"),
        "MLFLOW_TRACKING_URI": mlflow_server,
    }
    return root, env, mlflow_server


def _step(name: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run_component(name, *args, env=env)


def _train(root: Path, out: str, env: dict, epochs: int) -> dict:
    return result_of(
        _step(
            "train_model",
            env,
            "--data",
            str(root / "s"),
            "--output-dir",
            str(root / out),
            "--nproc-per-node",
            "1",
            "--checkpoint-every-steps",
            "0",
            "--epochs",
            str(epochs),
        )
    )


def _evaluate(root: Path, model: str, out: str, env: dict, name: str = NAME) -> subprocess.CompletedProcess:
    return _step(
        "evaluate_model",
        env,
        "--model",
        str(root / model),
        "--data",
        str(root / "s"),
        "--output-dir",
        str(root / out),
        "--thresholds",
        '{"accuracy": 0.3}',
        "--model-name",
        name,
        "--max-regression",
        '{"accuracy": 0.5}',
    )


def _register(root: Path, model: str, decision: str, out: str, env: dict, *extra: str, name: str = NAME) -> dict:
    return result_of(
        _step(
            "register_model",
            env,
            "--model",
            str(root / model),
            "--decision",
            str(root / decision),
            "--output-dir",
            str(root / out),
            "--model-name",
            name,
            *extra,
        )
    )


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


def _stored_file(tmp_root: Path, client, name: str, version: str, file: str) -> Path:
    """The file as the tracking server's artifact store holds it on disk."""
    from trainpipe.services import registry

    model_id = registry.logged_model_id(client.get_model_version(name, version))
    hits = [p for p in tmp_root.rglob(file) if model_id in p.parts]
    assert len(hits) == 1, hits
    return hits[0]


def _audit(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "audit.jsonl").read_text().splitlines()]


def test_registration_signs_and_every_loader_refuses_a_flipped_byte(gov, tmp_path_factory, monkeypatch):
    """Slow on purpose (about 1.5 minutes): two real trainings, a signed registration, then every loader
    (evaluate_model, detect_drift, lineage, promote, the pyfunc loader) refuses the registered model once
    one byte of its stored weights is flipped, each a process of its own as in a pipeline."""
    import mlflow

    from trainpipe.services import registry, signing

    root, env, server = gov
    mlflow.set_tracking_uri(server)
    client = mlflow.MlflowClient(server)
    _train(root, "m1", env, 2)
    assert _evaluate(root, "m1", "e1", env).returncode == 0
    r1 = _register(root, "m1", "e1", "r1", env)
    sha = r1["signature_sha256"]
    assert r1["version"] == "1" and r1["champion_moved"] and len(sha) == 64
    mv = client.get_model_version(NAME, "1")
    assert mv.tags[signing.SIGNATURE_TAG] == sha
    assert json.loads((root / "r1" / "lineage.json").read_text())["registration"]["signature_sha256"] == sha
    assert any(r["action"] == "sign" and r["decision"]["signature_sha256"] == sha for r in _audit(root))
    ok = _cli(env, "lineage", f"models:/{NAME}@champion", "--no-verify")
    assert ok.returncode == 0 and f"signature  verified, sha256 {sha[:16]}" in ok.stdout, ok.stderr
    # a rerun signs nothing twice: the same signature, verified
    assert _register(root, "m1", "e1", "r1b", env)["signature_sha256"] == sha

    # one byte of the registered weights flipped in the artifact store, after registration
    stored = _stored_file(tmp_path_factory.getbasetemp(), client, NAME, "1", "model.safetensors")
    original = stored.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    stored.write_bytes(bytes(flipped))
    try:
        _train(root, "m2", env, 1)
        refusals = {
            # evaluate_model loads the champion to compare with; detect_drift scores both sides with it
            "evaluate_model": _evaluate(root, "m2", "e2", env),
            "detect_drift": _step(
                "detect_drift", env, "--data", str(root / "s"), "--output-dir", str(root / "d2"), "--model-name", NAME
            ),
            "lineage": _cli(env, "lineage", f"models:/{NAME}/1", "--no-verify"),
            "promote": _cli(env, "promote", f"models:/{NAME}/1", "--reason", "looks fine"),
        }
        for who, proc in refusals.items():
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 7, (who, proc.returncode, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr and f"models:/{NAME}/1" in lines[-1], (who, lines[-1])
            assert "failed signature verification: model.safetensors differs from what was signed" in lines[-1], (
                who,
                lines[-1],
            )
        assert (
            not (root / "e2" / "decision.json").exists() and not (root / "d2" / "drift.json").exists()
        )  # nothing half-written
        assert client.get_model_version_by_alias(NAME, "champion").version == "1"
        # optimize_model and evaluate_model verify any signed model they are given: the registry's copy, downloaded
        copy = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"{client.get_logged_model(registry.logged_model_id(mv)).artifact_location}/artifacts/model",
                dst_path=str(root / "copy"),
            )
        )
        from trainpipe.contract.errors import SignatureInvalid
        from trainpipe.contract.runtime import Runtime
        from trainpipe.services.serving.package import load_artifact

        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(SignatureInvalid, match="model: failed signature verification: model.safetensors differs"):
            load_artifact(copy, Runtime())
    finally:
        stored.write_bytes(original)
    assert _cli(env, "lineage", f"models:/{NAME}/1", "--no-verify").returncode == 0  # restored: verifies again


def test_a_signature_by_another_key_or_a_missing_one_is_refused(gov, tmp_path):
    """Slow on purpose (about a minute): a version registered without signing is a real training, evaluation and
    registration, since the verifier must refuse what the registry really holds."""
    from trainpipe.services import signing

    root, env, _ = gov
    signing.keypair(tmp_path / "other.pem", tmp_path / "other.pub")
    other = _cli(
        {**env, signing.VERIFY_KEY_ENV: str(tmp_path / "other.pub")}, "lineage", f"models:/{NAME}/1", "--no-verify"
    )
    assert other.returncode == 7 and "signed with another key than the one this platform verifies with" in other.stderr
    # a version registered without signing, where the platform verifies: refused as unsigned
    unsigned_env = {k: v for k, v in env.items() if k != signing.SIGNING_KEY_ENV}
    _train(root, "m3", unsigned_env, 1)
    proc = _evaluate(root, "m3", "e3", unsigned_env, name="unsigned-digits")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r3 = _register(root, "m3", "e3", "r3", unsigned_env, name="unsigned-digits")
    assert r3["signature_sha256"] is None
    refused = _cli(env, "lineage", "models:/unsigned-digits/1", "--no-verify")
    assert (
        refused.returncode == 7
        and "carries no signature (model.sig); this platform loads only signed models" in refused.stderr
    )


def test_require_approval_registers_the_challenger_and_promote_moves_the_alias_audited(gov, tmp_path_factory):
    """Slow on purpose (about a minute): a real training, evaluation, int8 optimization and signed registration
    of both, then promotions refused (a tampered variant, a failed gate) and one approved, each a process of its own."""
    import mlflow

    from trainpipe.services import promote, registry, signing

    root, env, server = gov
    client = mlflow.MlflowClient(server)
    _train(root, "m4", env, 3)
    assert _evaluate(root, "m4", "e4", env, name=APPROVED).returncode == 0
    opt = result_of(
        _step(
            "optimize_model",
            env,
            "--model",
            str(root / "m4"),
            "--data",
            str(root / "s"),
            "--output-dir",
            str(root / "o4"),
            "--variants",
            '["int8_dynamic"]',
            "--max-metric-drop",
            "0.05",
        )
    )
    assert opt["selected"] == "int8_dynamic"
    r4 = _register(root, "m4", "e4", "r4", env, "--move-alias", "false", "--optimized", str(root / "o4"), name=APPROVED)
    v = r4["version"]
    # the optimized variant is signed too, and checked before its alias moves with the model's
    assert r4["optimized_signature_sha256"] and r4["optimized_signature_sha256"] != r4["signature_sha256"]
    onnx = _stored_file(
        tmp_path_factory.getbasetemp(), client, f"{APPROVED}-onnx", r4["optimized_version"], "model.onnx"
    )
    original = onnx.read_bytes()
    onnx.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))
    tampered = _cli(env, "promote", f"models:/{APPROVED}/{v}", "--reason", "reviewed")
    onnx.write_bytes(original)
    assert (
        tampered.returncode == 7
        and f"models:/{APPROVED}-onnx/{r4['optimized_version']}: failed signature verification: model.onnx differs"
        in tampered.stderr
    ), tampered.stderr
    assert registry.alias_version(client, APPROVED, "champion") is None
    # nobody holds the serving alias, and still it does not move without a person's approval
    assert r4["aliases"] == ["challenger"] and not r4["champion_moved"] and "trainpipe promote" in r4["reason"]
    assert registry.alias_version(client, APPROVED, "champion") is None

    # a version whose gate did not pass (registered by hand, its decision a failed one): refused, nothing moves
    mv = client.get_model_version(APPROVED, v)
    client.create_model_version(
        APPROVED, mv.source, model_id=registry.logged_model_id(mv), tags={promote.GATE_TAG: "False"}
    )
    record = tmp_path_factory.mktemp("promote") / "error.json"  # what the Airflow task reads, not the log
    failed = _cli(
        env, "promote", f"models:/{APPROVED}/{int(v) + 1}", "--reason", "try anyway", "--error-record", str(record)
    )
    assert failed.returncode == 4 and "did not pass its gate" in failed.stderr.strip().splitlines()[-1]
    said = json.loads(record.read_text())
    assert said["component"] == "promote" and said["exit_code"] == 4 and "did not pass its gate" in said["message"]
    for bad, code, says in (
        (f"models:/{APPROVED}@challenger", 2, "promote a version, not an alias"),
        (f"models:/{APPROVED}/99", 2, "models:/"),
    ):
        proc = _cli(env, "promote", bad, "--reason", "x")
        assert proc.returncode == code and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

    ok = _cli(
        {**env, "TRAINPIPE_IDENTITY": "alice@risk"},
        "promote",
        f"models:/{APPROVED}/{v}",
        "--reason",
        "reviewed the model card",
    )
    assert ok.returncode == 0, ok.stderr
    assert f"models:/{APPROVED}/{v} is now champion, approved by alice@risk" in ok.stdout
    assert client.get_model_version_by_alias(APPROVED, "champion").version == v
    tags = client.get_model_version(APPROVED, v).tags
    assert tags["trainpipe.approval.decision"] == "approved" and tags["trainpipe.approval.by"] == "alice@risk"
    assert tags["trainpipe.approval.reason"] == "reviewed the model card"
    assert client.get_model_version_by_alias(f"{APPROVED}-onnx", "champion").version == r4["optimized_version"]
    record = [r for r in _audit(root) if r["action"] == "promote"][-1]
    assert record["who"]["identity"] == "alice@risk" and record["decision"]["previous_version"] is None
    assert record["decision"]["signature_sha256"] == tags[signing.SIGNATURE_TAG]
    verify = _cli(env, "audit", "verify", str(root / "audit.jsonl"))
    assert verify.returncode == 0 and "intact" in verify.stdout
