"""trainpipe.services.signing on a model folder with the real OpenSSF model-signing and fresh key pairs: what
verification refuses, each in one line that says what happened."""

from __future__ import annotations

import pytest

from trainpipe.contract.errors import InputError, SignatureInvalid
from trainpipe.services import signing

pytestmark = pytest.mark.unit


@pytest.fixture
def signed(tmp_path, monkeypatch):
    signing.keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, str(tmp_path / "k.pem"))
    monkeypatch.delenv(signing.VERIFY_KEY_ENV, raising=False)
    monkeypatch.delenv(signing.VERIFY_CHAIN_ENV, raising=False)
    monkeypatch.delenv(signing.SIGNING_CERT_ENV, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (model / "model.json").write_text('{"builder": "builtin:mlp"}')
    sha = signing.sign(model)
    return tmp_path, model, sha


def test_a_signed_folder_verifies_with_the_public_key_and_the_signing_keys_own_half(signed, monkeypatch):
    tmp, model, sha = signed
    assert (model / signing.SIGNATURE_FILE).is_file() and len(sha) == 64
    assert signing.verify(model, "m", required=True, expected_digest=sha) == sha  # the signing key's public half
    monkeypatch.setenv(
        signing.VERIFY_KEY_ENV, (tmp / "k.pub").read_text()
    )  # the PEM itself, as a secret given as a variable
    assert signing.verify(model, "m") == sha


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda m: (m / "model.safetensors").write_bytes(b"\x01" + (m / "model.safetensors").read_bytes()[1:]),
            "model.safetensors differs from what was signed: it was changed after it was signed",
        ),
        (
            lambda m: (m / "extra.py").write_text("import os"),
            "files that were not signed were added (extra.py): it was changed after it was signed",
        ),
        (
            lambda m: (m / "model.json").unlink(),
            "files that were signed are missing (model.json): it was changed after it was signed",
        ),
    ],
)
def test_a_changed_added_or_missing_file_is_refused_in_one_line(signed, change, says):
    _, model, _ = signed
    change(model)
    with pytest.raises(SignatureInvalid) as err:
        signing.verify(model, "champion models:/digits/3")
    assert str(err.value) == f"champion models:/digits/3: failed signature verification: {says}"
    assert err.value.exit_code == 7 and "\n" not in str(err.value)


def test_another_key_a_replaced_signature_and_a_missing_one_are_refused(signed, monkeypatch):
    tmp, model, sha = signed
    signing.keypair(tmp / "other.pem", tmp / "other.pub")
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, str(tmp / "other.pub"))
    with pytest.raises(SignatureInvalid, match="signed with another key than the one this platform verifies with"):
        signing.verify(model, "m")
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, str(tmp / "k.pub"))
    with pytest.raises(SignatureInvalid, match="its signature is not the one recorded at registration"):
        signing.verify(model, "m", expected_digest="0" * 64)
    (model / signing.SIGNATURE_FILE).unlink()
    assert signing.verify(model, "m") is None  # unsigned, and nothing requires a signature
    with pytest.raises(SignatureInvalid, match="m: carries no signature"):
        signing.verify(model, "m", required=True)


def test_keys_that_cannot_be_used_are_one_line_input_errors(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    monkeypatch.delenv(signing.SIGNING_KEY_ENV, raising=False)
    with pytest.raises(InputError, match="TRAINPIPE_SIGNING_KEY: not set"):
        signing.sign(tmp_path / "m")
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, str(tmp_path / "absent.pem"))
    with pytest.raises(InputError, match="is not a readable file"):
        signing.sign(tmp_path / "m")
    (tmp_path / "bad.pem").write_text("not a key")
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, str(tmp_path / "bad.pem"))
    with pytest.raises(InputError, match="TRAINPIPE_SIGNING_KEY: cannot sign with it"):
        signing.sign(tmp_path / "m")


def _cert_chain(tmp_path):
    """A platform's CA and a code-signing certificate it issued (P-256, as a platform PKI would)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("platform CA"))
        .issuer_name(name("platform CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name("register_model"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (tmp_path / "signer.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (tmp_path / "signer.crt").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(pem))


def test_a_certificate_the_platform_issued_signs_and_its_chain_verifies(tmp_path, monkeypatch):
    _cert_chain(tmp_path)
    for env in (signing.VERIFY_KEY_ENV, signing.VERIFY_CHAIN_ENV, signing.SIGNING_CHAIN_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, str(tmp_path / "signer.pem"))
    monkeypatch.setenv(signing.SIGNING_CERT_ENV, str(tmp_path / "signer.crt"))
    monkeypatch.setenv(signing.SIGNING_CHAIN_ENV, str(tmp_path / "ca.crt"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    sha = signing.sign(model)
    monkeypatch.delenv(signing.SIGNING_KEY_ENV)  # a loader holds only the CA's certificate
    monkeypatch.delenv(signing.SIGNING_CERT_ENV)
    monkeypatch.setenv(signing.VERIFY_CHAIN_ENV, str(tmp_path / "ca.crt"))
    assert signing.verify(model, "m", required=True) == sha
    (model / "model.safetensors").write_bytes(b"\1" * 4096)
    with pytest.raises(SignatureInvalid, match="model.safetensors differs from what was signed"):
        signing.verify(model, "m")
    other = tmp_path / "other"
    other.mkdir()
    _cert_chain(other)  # another CA: its certificate does not root this signature
    monkeypatch.setenv(signing.VERIFY_CHAIN_ENV, str(other / "ca.crt"))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    with pytest.raises(
        SignatureInvalid,
        match="failed signature verification: it was signed with another key than the one this platform verifies with",
    ):
        signing.verify(model, "m")


def test_a_mismatch_whose_digest_holds_a_quote_still_names_the_file():
    # str() of model_signing's list of differences: a digest byte that is a double quote makes repr
    # escape the file name's single quotes (CI met it on a tampered model.onnx)
    text = (
        "Signature mismatch: ['Hash mismatch for \\'model.onnx\\': Expected \\'Digest(algorithm=\\'sha256\\', "
        "digest_value=b\\'\\\\xde\"\\\\x81\\')\\', "
        "Actual \\'Digest(algorithm=\\'sha256\\', digest_value=b\\'\\\\xba\\')\\'']"
    )
    reason = signing._reason(ValueError(text))
    assert reason == "model.onnx differs from what was signed: it was changed after it was signed"
