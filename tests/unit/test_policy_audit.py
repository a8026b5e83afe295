"""The policy (TLS, residency, encryption), the audit hash chain, and the config loader under fuzzing."""

from __future__ import annotations

import json
import string
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainpipe.contract import audit
from trainpipe.contract.config import build, load_file
from trainpipe.contract.errors import AuditTampered, InputError
from trainpipe.contract.policy import (
    Policy,
    check_encryption,
    check_endpoint,
    check_location,
    check_scheme,
    is_within,
    load_policy,
)

pytestmark = pytest.mark.unit

UAE = Policy(
    allowed_regions=["me-central-1"], allowed_locations=["s3://uae-data/ml", "/srv/uae"], require_encryption=True
)


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "http://localhost:8080/x",
        "http://[::1]:5000",
        "https://mlflow.example.com",
        "sqlite:///x.db",
    ],
)
def test_tls_allowed(uri):
    check_endpoint("tracking_uri", uri, Policy())


@pytest.mark.parametrize("uri", ["http://mlflow.example.com", "http://10.0.0.7:5000", "HTTP://Mlflow.Example.com/"])
def test_plain_http_off_loopback_is_refused_unless_allowed(uri):
    with pytest.raises(InputError, match=r"^tracking_uri: plain http:// to .* is refused"):
        check_endpoint("tracking_uri", uri, Policy())
    host = uri.split("//")[1].split(":")[0].split("/")[0]
    check_endpoint("tracking_uri", uri, Policy(allow_plain_http=[host]))


def test_residency_locations_by_segment_not_by_string_prefix(tmp_path):
    assert is_within("s3://uae-data/ml/dvc", "s3://uae-data/ml")
    assert not is_within("s3://uae-data/ml-other", "s3://uae-data/ml")
    assert not is_within("gs://uae-data/ml", "s3://uae-data/ml")
    assert is_within(str(tmp_path / "a" / "b"), str(tmp_path))
    assert not is_within(str(tmp_path / ".." / "x"), str(tmp_path))
    check_location("remote_url", "s3://uae-data/ml/dvc", "me-central-1", UAE)
    with pytest.raises(InputError, match="outside the policy's allowed_locations"):
        check_location("remote_url", "s3://eu-data/ml", "me-central-1", UAE)
    with pytest.raises(InputError, match="region 'eu-west-1' .* is not allowed"):
        check_location("remote_url", "s3://uae-data/ml/x", "eu-west-1", UAE)
    with pytest.raises(InputError, match="region of .* is not set"):
        check_location("remote_url", "s3://uae-data/ml/x", None, UAE)
    with pytest.raises(InputError, match="outside"):
        check_location("remote_url", "/srv/uae/../elsewhere", None, UAE)
    check_location("remote_url", "/srv/uae/dvc", None, UAE)


def test_encryption_required_for_object_stores():
    check_encryption("remote_sse", "s3://uae-data/ml", "aws:kms", UAE)
    with pytest.raises(InputError, match="would be written unencrypted"):
        check_encryption("remote_sse", "s3://uae-data/ml", None, UAE)
    with pytest.raises(InputError, match="cannot configure"):
        check_encryption("remote_sse", "gs://bucket/x", None, UAE)
    check_encryption("remote_sse", "s3://any/x", None, Policy())


def test_unsupported_scheme_names_it():
    with pytest.raises(InputError, match=r"remote_url: unsupported URI scheme 'ftp://'"):
        check_scheme("remote_url", "ftp://host/x", ("file", "s3"))


def test_policy_from_env_file_or_inline_json(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPIPE_POLICY", json.dumps({"allowed_regions": ["me-central-1"]}))
    assert load_policy().allowed_regions == ["me-central-1"]
    f = tmp_path / "policy.yaml"
    f.write_text("require_encryption: true\nallow_plain_http: [mlflow.internal]\n")
    monkeypatch.setenv("TRAINPIPE_POLICY", str(f))
    assert load_policy().require_encryption
    f.write_text("require_encryption: true\nallowed_region: [x]\n")
    with pytest.raises(InputError, match="policy field 'allowed_region': unknown key"):
        load_policy()


def _chain(tmp_path, n=5):
    log = tmp_path / "audit" / "audit.jsonl"
    for i in range(n):
        audit.append(log, [{"action": "execute", "component": f"c{i}", "who": {"identity": "alice"}}])
    return log


def test_audit_chain_verifies_and_names_tampering(tmp_path):
    log = _chain(tmp_path)
    assert audit.verify(log)["records"] == 5
    lines = log.read_text().splitlines(keepends=True)

    def broken(text, match):
        log.write_text(text)
        with pytest.raises(AuditTampered, match=match):
            audit.verify(log)

    edited = json.loads(lines[2])
    edited["component"] = "forged"
    broken("".join(lines[:2] + [json.dumps(edited, sort_keys=True) + "\n"] + lines[3:]), "seq 2. was edited")
    broken("".join(lines[:1] + lines[2:]), "expected 1")  # removed
    broken("".join([lines[0], lines[2], lines[1], *lines[3:]]), "expected 1")  # reordered
    broken("".join(lines[:4]), "removed from the end")  # cut tail
    # an attacker who recomputes the edited record's hash still breaks the next link
    edited["hash"] = audit.record_hash(edited)
    broken("".join(lines[:2] + [json.dumps(edited, sort_keys=True) + "\n"] + lines[3:]), "seq 3. does not follow")
    log.write_text("".join(lines))
    assert audit.verify(log)["head"] == json.loads(lines[-1])["hash"]


def test_audit_appends_from_many_processes_interleave_cleanly(tmp_path):
    log = tmp_path / "audit.jsonl"
    code = (
        "import sys\nfrom pathlib import Path\nfrom trainpipe.contract import audit\n"
        "for i in range(20): audit.append(Path(sys.argv[1]), [{'action': 'execute', 'component': sys.argv[2]}])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(log), f"p{i}"]) for i in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    assert audit.verify(log)["records"] == 80


def test_audit_verify_command_exit_codes(tmp_path):
    log = _chain(tmp_path, 3)
    ok = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "audit", "verify", str(log)], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "intact, 3 records" in ok.stdout
    log.write_text(log.read_text().replace('"c1"', '"cX"'))
    bad = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "audit", "verify", str(log)], capture_output=True, text=True
    )
    assert bad.returncode == 6 and bad.stderr.count("\n") == 1 and "seq 1) was edited" in bad.stderr


# --- the config loader under fuzzing: any input gives a valid config or one InputError line -------------

from trainpipe.components.train_model.spec import TrainModelConfig  # noqa: E402
from trainpipe.pipelines.config import PipelineConfig  # noqa: E402

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
_keys = st.one_of(
    st.sampled_from(sorted(TrainModelConfig.model_fields) + sorted(PipelineConfig.model_fields)),
    st.text(string.ascii_lowercase + "_", min_size=1, max_size=12),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _values, max_size=8))
def test_fuzzed_configs_validate_or_fail_in_one_line(data):
    for model in (TrainModelConfig, PipelineConfig):
        try:
            build(model, data, where="config")
        except InputError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("config field")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_fuzzed_config_files_load_or_fail_in_one_line(tmp_path, blob):
    for suffix in (".yaml", ".json"):
        f = tmp_path / f"c{suffix}"
        f.write_bytes(blob)
        try:
            data = load_file(f)
        except InputError as exc:
            assert "\n" not in str(exc)
        else:
            assert isinstance(data, dict)


def test_the_documented_policy_example_is_a_valid_policy():
    import re
    from pathlib import Path

    import yaml

    section = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1)
    policy = build(Policy, yaml.safe_load(block), where="policy")
    assert policy.require_encryption and policy.allowed_regions == ["me-central-1"] and policy.sse == "aws:kms"
