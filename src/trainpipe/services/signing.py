"""Signed models: OpenSSF ``model-signing`` over a registered model's files, offline.

register_model signs the copy of the model the registry holds (the weights-only directory every
trainpipe loader reads: ``model.safetensors`` or the ONNX file, and ``model.json``) with the
platform's key, and puts the signature, a Sigstore bundle, beside those files as ``model.sig``: it
travels with the model wherever the model is downloaded. Its sha256 goes into the version's tags,
the lineage and the audit log.

Whoever loads a signed model verifies it first (a loader given a directory with ``model.sig``;
every download of a registered version; ``trainpipe lineage`` and ``promote``): one changed byte,
an added or a missing file, or a signature by another key is refused in one line (exit 7), before
anything is read. Where the platform sets a verification key, a registered version without a
signature is refused too.

Keys are files the platform mounts (a Kubernetes secret as a volume), or the PEM text itself in the
variable (a secret given as an environment variable); nothing here needs the internet:

- ``TRAINPIPE_SIGNING_KEY``: the private key (PEM, elliptic curve) register_model signs with; with
  ``TRAINPIPE_SIGNING_CERT`` (and ``TRAINPIPE_SIGNING_CERT_CHAIN``, paths joined by ``:``) the
  signature carries that certificate instead of a bare key;
- ``TRAINPIPE_VERIFY_KEY``: the public key loaders verify with, or ``TRAINPIPE_VERIFY_CERT_CHAIN``
  (the certificate chain that roots the signing certificate). Without either, the public half of
  the signing key is used.

``model_signing`` is imported inside the functions.
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError, SignatureInvalid
from trainpipe.contract.io import atomic_write_bytes, file_digest

SIGNING_KEY_ENV = "TRAINPIPE_SIGNING_KEY"
SIGNING_CERT_ENV = "TRAINPIPE_SIGNING_CERT"
SIGNING_CHAIN_ENV = "TRAINPIPE_SIGNING_CERT_CHAIN"
VERIFY_KEY_ENV = "TRAINPIPE_VERIFY_KEY"
VERIFY_CHAIN_ENV = "TRAINPIPE_VERIFY_CERT_CHAIN"
#: The signature beside the model's files (ignored by the signature itself).
SIGNATURE_FILE = "model.sig"
#: The version tag that holds the signature's sha256.
SIGNATURE_TAG = "trainpipe.signature_sha256"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def signing_enabled() -> bool:
    """Whether register_model signs (the platform set a signing key)."""
    return bool(os.environ.get(SIGNING_KEY_ENV))


def verification_required() -> bool:
    """Whether a registered version must carry a signature (the platform set what to verify with)."""
    return bool(os.environ.get(VERIFY_KEY_ENV) or os.environ.get(VERIFY_CHAIN_ENV))


def _existing(env: str) -> Path:
    """The file a key variable names, or, when the variable holds the PEM itself (a Kubernetes
    secret given as an environment variable: the profile's ``secrets_as_env``), a private
    temporary copy of it."""
    value = os.environ[env]
    if value.lstrip().startswith("-----BEGIN"):
        fd, name = tempfile.mkstemp(prefix="trainpipe-key-", suffix=".pem")  # 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(value.strip() + "\n")
        atexit.register(_remove, name)  # a private key's copy does not outlive the step
        return Path(name)
    path = Path(value)
    if not path.is_file():
        raise InputError(f"{env}: {str(path)!r} is not a readable file (give a path, or the PEM itself)")
    return path


def _chain(env: str) -> list[Path]:
    raw = os.environ.get(env, "")
    paths = [Path(p) for p in raw.split(":") if p]
    for p in paths:
        if not p.is_file():
            raise InputError(f"{env}: {str(p)!r} is not a readable file")
    return paths


def sign(model_dir: str | Path, signature: str | Path | None = None) -> str:
    """Sign every file of ``model_dir`` (``model.sig`` aside) with the platform's key.

    Args:
        model_dir: The model's directory, as loaders will read it.
        signature: Where the bundle goes (default: ``model_dir/model.sig``).

    Returns:
        The signature's sha256.

    Raises:
        InputError: no signing key is set, or the key (or certificate) cannot be used.
    """
    from model_signing import hashing, signing

    if not signing_enabled():
        raise InputError(f"{SIGNING_KEY_ENV}: not set; signing needs the platform's private key")
    model_dir = Path(model_dir)
    target = Path(signature) if signature else model_dir / SIGNATURE_FILE
    config = signing.Config().set_hashing_config(hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE]))
    try:
        if os.environ.get(SIGNING_CERT_ENV):
            config.use_certificate_signer(
                private_key=_existing(SIGNING_KEY_ENV),
                signing_certificate=_existing(SIGNING_CERT_ENV),
                certificate_chain=_chain(SIGNING_CHAIN_ENV),
            )
        else:
            config.use_elliptic_key_signer(private_key=_existing(SIGNING_KEY_ENV))
        with tempfile.TemporaryDirectory() as tmp:  # written whole, then moved in: never a half signature
            staged = Path(tmp) / SIGNATURE_FILE
            config.sign(model_dir, staged)
            atomic_write_bytes(target, staged.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        raise InputError(f"{SIGNING_KEY_ENV}: cannot sign with it: {_first(exc)}") from None
    return file_digest(target, "sha256")


def _verifier() -> Any:
    from model_signing import verifying

    config = verifying.Config()
    if os.environ.get(VERIFY_CHAIN_ENV):
        return config.use_certificate_verifier(certificate_chain=_chain(VERIFY_CHAIN_ENV))
    if os.environ.get(VERIFY_KEY_ENV):
        return config.use_elliptic_key_verifier(public_key=_existing(VERIFY_KEY_ENV))
    if os.environ.get(SIGNING_CERT_ENV):
        return config.use_certificate_verifier(
            certificate_chain=_chain(SIGNING_CHAIN_ENV) or [_existing(SIGNING_CERT_ENV)]
        )
    if signing_enabled():  # the public half of the signing key
        from cryptography.hazmat.primitives import serialization

        private = serialization.load_pem_private_key(_existing(SIGNING_KEY_ENV).read_bytes(), password=None)
        fd, name = tempfile.mkstemp(prefix="trainpipe-verify-", suffix=".pem")
        os.close(fd)
        atexit.register(_remove, name)
        public = Path(name)
        public.write_bytes(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return config.use_elliptic_key_verifier(public_key=public)
    raise InputError(
        f"{VERIFY_KEY_ENV}: the model is signed but no key to verify it with is set "
        f"({VERIFY_KEY_ENV}, {VERIFY_CHAIN_ENV} or {SIGNING_KEY_ENV})"
    )


def verify(
    model_dir: str | Path, what: str, *, required: bool = False, expected_digest: str | None = None
) -> str | None:
    """Verify ``model_dir`` against the ``model.sig`` beside its files, before anything reads them.

    Args:
        model_dir: The model's directory.
        what: What the model is, for the error (``champion models:/digits/3``).
        required: Refuse a directory without a signature (a registered version where the
            platform verifies).
        expected_digest: The signature's sha256 as recorded at registration: a replaced
            signature is refused too.

    Returns:
        The signature's sha256, or None when the directory is unsigned (and that is allowed).

    Raises:
        SignatureInvalid: a file changed, added or missing, a signature by another key, an
            unsigned model where one is required, or a signature other than the one recorded.
        InputError: no key to verify with.
    """
    model_dir = Path(model_dir)
    signature = model_dir / SIGNATURE_FILE
    if not signature.is_file():
        if required or expected_digest:
            raise SignatureInvalid(
                f"{what}: carries no signature ({SIGNATURE_FILE}); this platform loads only signed models"
            )
        return None
    found = file_digest(signature, "sha256")
    if expected_digest and found != expected_digest:
        raise SignatureInvalid(
            f"{what}: its signature is not the one recorded at registration (sha256 {found[:12]}…, "
            f"recorded {expected_digest[:12]}…)"
        )
    try:
        _verifier().verify(model_dir, signature)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 (model_signing raises ValueError and its crypto libraries their own)
        raise SignatureInvalid(f"{what}: failed signature verification: {_reason(exc)}") from None
    return found


def _reason(exc: BaseException) -> str:
    """model_signing's mismatch (a list of differences, or a key error) as a short phrase.

    Its message embeds a list's repr: where a digest's bytes hold a double quote, Python escapes the
    single quotes around each file name, so the quotes are matched with or without a backslash."""
    text = str(exc).replace("\\'", "'")
    parts = []
    changed = re.findall(r"Hash mismatch for '([^']+)'", text)
    if changed:
        parts.append(f"{', '.join(changed)} differ{'s' if len(changed) == 1 else ''} from what was signed")
    extra = re.search(r"Extra files found in model '[^']*': ([^\"\]]+)", text)
    if extra:
        parts.append(f"files that were not signed were added ({extra.group(1).strip(' ,')})")
    missing = re.search(r"Missing files in model '[^']*': ([^\"\]]+)", text)
    if missing:
        parts.append(f"files that were signed are missing ({missing.group(1).strip(' ,')})")
    if parts:
        return "; ".join(parts) + ": it was changed after it was signed"
    if "key" in text.lower() or "certificate" in text.lower():
        return "it was signed with another key than the one this platform verifies with"
    return _first(exc)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def keypair(private: str | Path, public: str | Path) -> None:
    """Write a new P-256 key pair (PEM): ``trainpipe keys``, the tests and the benchmark use it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    Path(private).write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(private, 0o600)
    Path(public).write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
