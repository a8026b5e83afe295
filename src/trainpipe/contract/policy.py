"""The platform's policy: where data may go, how it must travel and rest, where audit goes.

A platform team writes one policy file and points every step at it with
``TRAINPIPE_POLICY`` (a path, or the JSON itself). The compiler and ``trainpipe run``
check what they can know before anything runs (the DVC remote, the tracking server, the
pipeline root) and put the policy on every task; each component checks again at run
time against what it is about to touch, so a step run by hand obeys it too.

With no policy set, only the transport rule holds: a plain ``http://`` endpoint off
this machine is refused (TLS is expected everywhere but loopback).

Stdlib and pydantic only: the scheduler and the compiler import it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field

from trainpipe.contract.config import StrictModel, build, load_file
from trainpipe.contract.errors import InputError

ENV = "TRAINPIPE_POLICY"

#: URI schemes of object stores whose encryption at rest trainpipe configures (SSE).
SSE_SCHEMES = ("s3",)


class Policy(StrictModel):
    """Data residency, transport and encryption rules, and the audit log's place."""

    allowed_regions: list[str] = Field(
        default_factory=list, description="cloud regions data may be stored in (e.g. me-central-1); empty: any"
    )
    allowed_locations: list[str] = Field(
        default_factory=list,
        description="storage prefixes data, models and pipeline artifacts may be written under "
        "(s3://bucket/prefix, gs://…, or a local directory); empty: any",
    )
    require_encryption: bool = Field(
        False, description="object-store remotes and artifact stores must be written with server-side encryption"
    )
    sse: Literal["AES256", "aws:kms"] | None = Field(
        None,
        description="server-side encryption trainpipe asks of object stores it writes when their own config sets none",
    )
    sse_kms_key_id: str | None = Field(None, description="the KMS key of aws:kms encryption")
    allow_plain_http: list[str] = Field(
        default_factory=list,
        description="hosts that may be reached over plain http:// although not loopback (TLS is expected everywhere "
        "else)",
    )
    audit_log: str | None = Field(
        None, description="the append-only audit log (a path in the artifact store); TRAINPIPE_AUDIT_LOG overrides it"
    )
    require_audit: bool = Field(False, description="refuse to run a component when no audit log is configured")
    output_umask: str = Field(
        "027",
        pattern=r"^0?[0-7]{3}$",
        description="what a step's outputs never grant, in octal as umask takes it: 027 (files 0640, folders 0750), "
        "022 to let every user read them, 077 for the owner only; a stricter umask of the step's own stays",
    )

    @property
    def restricts_storage(self) -> bool:
        return bool(self.allowed_regions or self.allowed_locations or self.require_encryption)


def load_policy(value: str | None = None) -> Policy:
    """The policy in force: ``value`` or ``TRAINPIPE_POLICY`` (a file path, or inline JSON).

    Raises:
        InputError: the policy is not readable or not valid.
    """
    raw = (value if value is not None else os.environ.get(ENV, "")).strip()
    if not raw:
        return Policy()
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise InputError(f"{ENV}: not valid JSON: {exc}") from None
    else:
        data = load_file(raw)
    return build(Policy, data, where="policy")


def to_env(policy: Policy) -> str:
    """The policy as the compact JSON ``TRAINPIPE_POLICY`` carries onto a task."""
    return json.dumps(policy.model_dump(mode="json", exclude_defaults=True), sort_keys=True, separators=(",", ":"))


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(field: str, uri: str, policy: Policy | None = None) -> None:
    """Refuse plain ``http://`` to a host that is neither loopback nor allowed.

    Args:
        field: The setting that holds ``uri``, named in the error.
        uri: A tracking URI, remote endpoint or API host.
        policy: The policy (default: the one in force).

    Raises:
        InputError: the endpoint would carry data or credentials unencrypted.
    """
    parts = urlsplit(uri)
    if parts.scheme.lower() != "http":
        return
    host = (parts.hostname or "").lower()
    policy = policy if policy is not None else load_policy()
    if _is_loopback(host) or host in {h.lower() for h in policy.allow_plain_http}:
        return
    raise InputError(
        f"{field}: plain http:// to {host!r} is refused (TLS is expected off this machine: use https://, "
        f"or list the host in the policy's allow_plain_http)"
    )


def _location(uri: str) -> tuple[str, str]:
    """(scheme, normalized location) of a URI or a local path."""
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", uri):
        return "file", str(Path(uri).expanduser().resolve())
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return "file", str(Path(parts.path).resolve())
    return scheme, f"{scheme}://{parts.netloc}{parts.path}".rstrip("/")


def is_within(uri: str, prefix: str) -> bool:
    """Whether ``uri`` lies at or under ``prefix`` (path segments, not string prefixes)."""
    s1, loc = _location(uri)
    s2, base = _location(prefix)
    if s1 != s2:
        return False
    if s1 == "file":
        return Path(loc).is_relative_to(base)
    return loc == base or loc.startswith(base + "/")


def check_location(field: str, uri: str, region: str | None = None, policy: Policy | None = None) -> None:
    """Refuse storage outside the allowed locations or regions (data residency).

    Args:
        field: The setting that holds ``uri``, named in the error.
        uri: Where data, a model or pipeline artifacts would be written.
        region: The storage's region, when it is an object store.
        policy: The policy (default: the one in force).

    Raises:
        InputError: the location or its region is not allowed, or an object store's region is unknown.
    """
    policy = policy if policy is not None else load_policy()
    if policy.allowed_locations and not any(is_within(uri, p) for p in policy.allowed_locations):
        raise InputError(
            f"{field}: {uri!r} is outside the policy's allowed_locations ({', '.join(policy.allowed_locations)})"
        )
    scheme, _ = _location(uri)
    if policy.allowed_regions and scheme != "file":
        if not region:
            raise InputError(
                f"{field}: the region of {uri!r} is not set; the policy allows only {', '.join(policy.allowed_regions)}"
            )
        if region not in policy.allowed_regions:
            raise InputError(
                f"{field}: region {region!r} of {uri!r} is not allowed by the policy (allowed: "
                f"{', '.join(policy.allowed_regions)})"
            )


def env_region() -> str | None:
    """The object store's region as boto reads it from the environment (``AWS_REGION``, ``AWS_DEFAULT_REGION``)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def check_store(field: str, uri: str, sse: str | None, region: str | None = None, policy: Policy | None = None) -> None:
    """Residency and encryption of one place data is written to (:func:`check_location`, :func:`check_encryption`).

    ``region`` defaults to :func:`env_region`.

    Raises:
        InputError: the place is outside the policy.
    """
    policy = policy if policy is not None else load_policy()
    check_location(field, uri, region or env_region(), policy)
    check_encryption(field, uri, sse, policy)


def check_encryption(field: str, uri: str, sse: str | None, policy: Policy | None = None) -> None:
    """Refuse an object-store location written without server-side encryption when the policy requires it.

    Raises:
        InputError: encryption is required and ``sse`` is not set for an object store.
    """
    policy = policy if policy is not None else load_policy()
    scheme, _ = _location(uri)
    if policy.require_encryption and scheme not in SSE_SCHEMES + ("file",):
        raise InputError(
            f"{field}: {uri!r} is a store whose encryption trainpipe cannot configure; the policy requires server-side "
            "encryption (use s3:// with sse)"
        )
    if policy.require_encryption and scheme in SSE_SCHEMES and not sse:
        raise InputError(
            f"{field}: {uri!r} would be written unencrypted; the policy requires server-side encryption (set sse to "
            "AES256 or aws:kms)"
        )


def check_scheme(field: str, uri: str, allowed: tuple[str, ...]) -> None:
    """Refuse a URI whose scheme trainpipe does not support for ``field``.

    Raises:
        InputError: the scheme is not one of ``allowed`` (``file`` stands for a local path).
    """
    scheme = _location(uri)[0]
    if scheme not in allowed:
        raise InputError(
            f"{field}: unsupported URI scheme {scheme + '://'!r} in {uri!r} (supported: "
            f"{', '.join(s + '://' if s != 'file' else 'a local path' for s in allowed)})"
        )


def s3_upload_args(sse: str | None, kms_key_id: str | None) -> dict[str, str]:
    """boto3 ``ExtraArgs`` that make S3 encrypt an upload at rest."""
    if not sse:
        return {}
    args = {"ServerSideEncryption": sse}
    if sse == "aws:kms" and kms_key_id:
        args["SSEKMSKeyId"] = kms_key_id
    return args
