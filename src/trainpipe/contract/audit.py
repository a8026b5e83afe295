"""The audit trail: an append-only, hash-chained JSON-lines log.

Every component execution (ok or failed), every gate decision and every alias change
appends one record: who (the identity from the environment), what, when, the inputs
and outputs by hash, and the decision. Each record carries the hash of the one before
it and its own hash over its canonical JSON; a head file beside the log holds the last
sequence number and hash. ``trainpipe audit verify`` recomputes the chain, so an
edited, removed, inserted or reordered record, or a cut tail, is detected.

The log lives in the artifact store (``TRAINPIPE_AUDIT_LOG``, or the policy's
``audit_log``): a path on a shared volume. Appends take an exclusive ``flock`` so
steps running at once never interleave. Stdlib only.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import getpass
import hashlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import AuditTampered, InputError
from trainpipe.contract.io import atomic_write_json

ENV = "TRAINPIPE_AUDIT_LOG"
GENESIS = "0" * 64
_SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def log_path(policy_log: str | None = None) -> Path | None:
    """Where audit records go: ``TRAINPIPE_AUDIT_LOG``, else the policy's ``audit_log``, else nowhere."""
    raw = os.environ.get(ENV) or policy_log
    if not raw:
        return None
    if "://" in raw and not raw.startswith("file://"):
        raise InputError(f"audit_log: {raw!r} must be a path on a mounted volume (object stores cannot append)")
    return Path(raw.removeprefix("file://")).resolve()


def head_path(log: Path) -> Path:
    return log.with_name(log.name + ".head")


def identity() -> dict[str, str]:
    """Who is acting, from the environment; never a credential.

    ``TRAINPIPE_IDENTITY`` when the platform sets it; else the Kubernetes service account
    named in the pod's token (its claims only, the token itself is not kept); else the
    Airflow DAG owner; else the operating-system user.
    """
    if os.environ.get("TRAINPIPE_IDENTITY"):
        return {"identity": os.environ["TRAINPIPE_IDENTITY"], "source": "TRAINPIPE_IDENTITY"}
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        payload = _SA_TOKEN.read_text().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return {"identity": str(claims["sub"]), "source": "kubernetes service account"}
    if os.environ.get("AIRFLOW_CTX_DAG_OWNER"):
        return {"identity": os.environ["AIRFLOW_CTX_DAG_OWNER"], "source": "airflow dag owner"}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"identity": f"{user}@{socket.gethostname()}", "source": "os user"}


def record_hash(record: dict[str, Any]) -> str:
    """sha256 of the record's canonical JSON, its own ``hash`` left out."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


@contextlib.contextmanager
def _locked(log: Path) -> Iterator[int]:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _last(log: Path) -> tuple[int, str]:
    head = head_path(log)
    if head.is_file():
        doc = json.loads(head.read_text())
        return int(doc["seq"]), str(doc["hash"])
    if log.stat().st_size:
        raise AuditTampered(f"audit_log: {str(log)!r} has records but no head file {head.name!r}: it was tampered with")
    return -1, GENESIS


def append(log: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append ``events`` to the chain at ``log``, in order, under one lock.

    Args:
        log: The log file (created with its head file if missing).
        events: Records without ``seq``, ``time``, ``prev`` or ``hash``.

    Returns:
        The records as written.

    Raises:
        InputError: the log cannot be written.
    """
    written = []
    try:
        with _locked(log) as fd:
            seq, prev = _last(log)
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
            lines = []
            for event in events:
                seq += 1
                record = {"seq": seq, "time": now, **event, "prev": prev}
                record["hash"] = prev = record_hash(record)
                lines.append(json.dumps(record, sort_keys=True, default=str) + "\n")
                written.append(record)
            os.write(fd, "".join(lines).encode())
            os.fsync(fd)
            atomic_write_json(head_path(log), {"seq": seq, "hash": prev})
    except OSError as exc:
        raise InputError(f"audit_log: cannot append to {str(log)!r}: {exc.strerror}") from None
    return written


def verify(log: Path) -> dict[str, Any]:
    """Recompute the chain.

    Returns:
        ``{"records": n, "head": hash}`` when every record is intact and in place.

    Raises:
        InputError: the log does not exist.
        AuditTampered: the first record that was edited, removed, inserted or reordered, or a cut tail.
    """
    if not log.is_file():
        raise InputError(f"audit_log: {str(log)!r} does not exist")
    prev, n = GENESIS, 0
    with open(log, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                record = json.loads(line)
            except ValueError:
                raise AuditTampered(f"audit_log: line {lineno} is not a JSON record") from None
            if record.get("seq") != n:
                raise AuditTampered(
                    f"audit_log: line {lineno} has seq {record.get('seq')!r}, expected {n} (a record was removed, "
                    "inserted or reordered)"
                )
            if record.get("prev") != prev:
                raise AuditTampered(
                    f"audit_log: line {lineno} (seq {n}) does not follow the record before it (removed, inserted or "
                    "reordered)"
                )
            if record_hash(record) != record.get("hash"):
                raise AuditTampered(
                    f"audit_log: line {lineno} (seq {n}) was edited: its hash does not match its content"
                )
            prev, n = record["hash"], n + 1
    head = head_path(log)
    if not head.is_file():
        if n:
            raise AuditTampered(f"audit_log: the head file {head.name!r} is missing")
    else:
        doc = json.loads(head.read_text())
        if doc.get("seq") != n - 1 or doc.get("hash") != prev:
            raise AuditTampered(
                f"audit_log: the head says seq {doc.get('seq')} but the log ends at seq {n - 1} (records were removed "
                "from the end)"
            )
    return {"records": n, "head": prev}


def payload_hash(payload: dict[str, Any]) -> str:
    """sha256 of a result's canonical JSON."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def artifact_hash(path: str | os.PathLike[str]) -> str | None:
    """sha256 of an artifact directory's completion marker, which names its content by hash."""
    from trainpipe.contract.artifacts import MARKER

    marker = Path(path) / MARKER
    try:
        return hashlib.sha256(marker.read_bytes()).hexdigest()
    except OSError:
        return None
