"""The MLflow model registry as trainpipe uses it: aliases, idempotency tags, and the
weights-only copy of each registered model that a champion is loaded from.

A registered version is made from the MLflow model train_model logged, which holds the
weights-only artifact (model.safetensors + model.json): the champion is rebuilt from those
weights, so comparing against it never unpickles anything. mlflow is imported inside the
functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HASH_TAG = "trainpipe.model_sha256"
DATA_TAG = "trainpipe.dataset_md5"
RUN_TAG = "trainpipe.training_run_id"
#: On an optimized version: ``<model>/<version>`` it was made from; on that version: the optimized one.
PARENT_TAG = "trainpipe.parent_version"
OPTIMIZED_TAG = "trainpipe.optimized_version"
#: The serving alias, named once: register_model moves it to a version that beat its holder,
#: evaluate_model compares a new model with the version under it, detect_drift measures drift
#: against that version's training data, and ``trainpipe promote`` moves it after an approval.
DEFAULT_ALIAS = "champion"
#: The alias every new registration gets.
CHALLENGER = "challenger"
#: What MLflow accepts as an alias (and trainpipe in every alias setting).
ALIAS_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,254}$"


def alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The version an alias points at; None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    from trainpipe.services import tracking

    try:
        # A search sees only what the caller may read; with MLflow's auth app, asking for an
        # alias of a model that does not exist yet is "permission denied", not "not found".
        if not client.search_registered_models(filter_string=f"name = '{name}'"):
            return None
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        code = getattr(exc, "error_code", "")
        if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise tracking.classify(exc, f"tracking_uri: reading alias {alias!r} of {name!r}", "failed") from None


#: The registered model that is the lease on another's aliases (see :func:`alias_lease`).
LEASE_SUFFIX = "__trainpipe_lease"
#: Who holds a lease: host, process and a token of the holder's own.
LEASE_OWNER_TAG = "trainpipe.lease.owner"
#: A lease seen unchanged this long was left by a holder that died in it, and is broken. Holding one
#: takes three requests; this allows each of them every retry and timeout MLflow's client makes.
LEASE_TTL_S = 300.0
#: A registration waits this long for the lease (beyond a dead holder's), then exits 75 (retried).
LEASE_WAIT_S = LEASE_TTL_S + 60.0
LEASE_DESCRIPTION = "trainpipe: held while a registration or a promotion moves this model's aliases; deleted after"


def lease_name(name: str) -> str:
    """The registered model that is the lease on the aliases of ``name`` (within MLflow's 256 characters)."""
    if len(name) + len(LEASE_SUFFIX) <= 256:
        return name + LEASE_SUFFIX
    return f"{name[:200]}_{hashlib.sha256(name.encode()).hexdigest()[:16]}{LEASE_SUFFIX}"


@contextlib.contextmanager
def alias_lease(
    client: Any, name: str, *, ttl_s: float = LEASE_TTL_S, wait_s: float = LEASE_WAIT_S, poll_s: float = 0.02
) -> Iterator[None]:
    """Hold the lease on the aliases of the registered model ``name``: whoever reads an alias's holder
    and moves it (register_model, ``trainpipe promote``) does both under it, so a move is a real
    compare-and-set.

    MLflow's registry has no compare-and-set, and the database behind a tracking server is not
    reachable from every step, so the lease lives in the registry itself: a registered model
    ``<name>__trainpipe_lease``, which only one process can create (its name is unique in every store
    MLflow has: SQLite, PostgreSQL, MySQL, behind a server or not). Deleting it releases it. A lease
    seen unchanged for ``ttl_s`` was left by a holder that died inside it: it is broken by renaming
    it to a name made of its own creation time, which only one waiter can do (a second rename of the
    same lease finds the name taken), so a fresh lease is never broken by a waiter that looked earlier.

    Raises:
        ServiceUnavailable: the lease was not free within ``wait_s`` (transient: the step is retried),
            or MLflow cannot be reached.
        NotPermitted: the identity may not create or delete the lease.
    """
    lease = lease_name(name)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    _acquire(client, lease, owner, ttl_s, wait_s, poll_s)
    try:
        yield
    finally:
        _release(client, lease, owner)


def _lease_held(client: Any, lease: str) -> tuple[str, int] | None:
    """``(owner, creation time)`` of a lease, or None when it is free."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(lease)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return None
        raise
    return str(model.tags.get(LEASE_OWNER_TAG, "")), int(model.creation_timestamp or 0)


def _take(client: Any, lease: str, owner: str) -> tuple[str, int] | None:
    """Create the lease: None when this process holds it now, else who holds it (``("", 0)``: nobody
    any more, it was released between the two requests)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(lease, tags={LEASE_OWNER_TAG: owner}, description=LEASE_DESCRIPTION)
        return None
    except MlflowException as exc:
        if getattr(exc, "error_code", "") not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
            raise
    held = _lease_held(client, lease)
    if held is not None and held[0] == owner:
        return None  # our create went through, and a retry of its request found it
    return held or ("", 0)


def _acquire(client: Any, lease: str, owner: str, ttl_s: float, wait_s: float, poll_s: float) -> None:
    from mlflow.exceptions import MlflowException

    from trainpipe.contract.errors import ServiceUnavailable
    from trainpipe.services import tracking

    what = f"tracking_uri: the lease {lease!r} on the aliases of {lease.removesuffix(LEASE_SUFFIX)!r}"
    first_seen: dict[tuple[str, int], float] = {}
    holder = "another process"
    deadline = time.monotonic() + wait_s
    delay = poll_s
    while time.monotonic() < deadline:
        try:
            held = _take(client, lease, owner)
            if held is None:
                return
            if held == ("", 0):
                continue
            if time.monotonic() - first_seen.setdefault(held, time.monotonic()) >= ttl_s:
                _break(client, lease, held)
                continue
        except MlflowException as exc:
            raise tracking.classify(exc, what, "cannot be taken") from None
        holder = held[0] or holder
        time.sleep(delay * (0.5 + random.random()))  # noqa: S311 (jitter, not a secret)
        delay = min(delay * 2, 0.25)
    raise ServiceUnavailable(f"{what} is still held by {holder} after {wait_s:.0f} s: another step is moving them")


def _break(client: Any, lease: str, held: tuple[str, int]) -> None:
    """Take a dead holder's lease out of the way: renamed after its creation time, so that of two waiters
    that saw it, one renames it and the other, finding the name taken, renames nothing (not even the
    lease the first then takes)."""
    from mlflow.exceptions import MlflowException

    print(
        f"trainpipe: warning: breaking the lease {lease!r} that {held[0] or 'a process'} left (it died holding it)",
        file=sys.stderr,
        flush=True,
    )
    try:
        client.rename_registered_model(lease, f"{lease}__broken_{held[1]}")
    except MlflowException as exc:
        if getattr(exc, "error_code", "") not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
            raise


def _release(client: Any, lease: str, owner: str) -> None:
    """Delete the lease when it is still ours (a holder that outlived its lease deletes nobody else's)."""
    try:
        held = _lease_held(client, lease)
        if held is not None and held[0] == owner:
            client.delete_registered_model(lease)
    except Exception as exc:  # noqa: BLE001 (the move is done or failed already: a lease left behind is broken later)
        print(f"trainpipe: warning: the lease {lease!r} was not released: {exc}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Champion:
    """The version that serves under an alias, as evaluate_model and detect_drift compare with it."""

    client: Any
    version: Any
    runtime: Any

    @property
    def number(self) -> str:
        """The version number."""
        return str(self.version.version)

    @property
    def run_id(self) -> str | None:
        """The training run that made it."""
        return self.version.tags.get(RUN_TAG) or self.version.run_id

    @property
    def age_days(self) -> float:
        """Days since it was registered."""
        return (time.time() - float(self.version.creation_timestamp) / 1000.0) / 86_400.0

    def model(self) -> tuple[Any | None, str]:
        """Its model rebuilt from the weights-only copy, or why it cannot be (see :func:`version_model`)."""
        return version_model(self.client, self.version, self.runtime)


def champion(tracking_uri: str | None, name: str, alias: str, runtime: Any) -> Champion | None:
    """The version serving under ``alias`` of the registered model ``name``; None when there is none.

    Raises:
        ServiceUnavailable: the tracking server cannot be reached.
        InputError: the policy refuses the tracking server.
    """
    from trainpipe.services import tracking

    if no_alias_in_sqlite_store(tracking.resolve_tracking_uri(tracking_uri, runtime.policy), name, alias):
        return None  # the demo's first run: known without MLflow's import (seconds) and its store's opening
    client = tracking.connect(tracking_uri, runtime.policy)
    version = alias_version(client, name, alias)
    return None if version is None else Champion(client, version, runtime)


def no_alias_in_sqlite_store(resolved: str, name: str, alias: str) -> bool:
    """True only when ``resolved`` is a local SQLite store that certainly holds no version under ``alias`` of
    ``name`` (no such file yet in an existing folder, or no such row in MLflow's alias table in any workspace),
    read with the standard library. Every other case (a server, a registry elsewhere, a row found, a store that
    cannot be read as expected) answers False, and MLflow itself is asked, with the answer and errors it gives.

    A step with nothing to compare with (the demo's first run: detect_drift with no champion, the gate with no
    champion) then says so without importing MLflow, which alone is most of such a step's seconds.
    """
    import sqlite3

    if not resolved.startswith("sqlite:///") or os.environ.get("MLFLOW_REGISTRY_URI"):
        return False
    path = Path(resolved[len("sqlite:///") :])
    if not path.exists():
        return path.parent.is_dir()  # MLflow would make an empty store here (a missing folder: its own error)
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            query = "SELECT 1 FROM registered_model_aliases WHERE name = ? AND alias = ? LIMIT 1"
            return db.execute(query, (name, alias)).fetchone() is None
    except sqlite3.Error:  # no alias table (an older schema MLflow migrates), locked, not a database: MLflow says
        return False


def logged_model_id(version: Any) -> str | None:
    """The MLflow logged model a registered version was made from (``models:/<id>``)."""
    model_id = getattr(version, "model_id", None)
    if model_id:
        return str(model_id)
    source = str(getattr(version, "source", "") or "")
    return source[len("models:/") :].split("/")[0] if source.startswith("models:/m-") else None


def version_model(client: Any, version: Any, runtime: Any, what: str | None = None) -> tuple[Any | None, str]:
    """A registered version's model rebuilt from its weights-only copy (nothing unpickled; a team's
    code only where ``runtime`` trusts it): ``(model, "")``, or ``(None, why it cannot be)``. What
    evaluate_model compares a challenger with, and detect_drift scores both sides with.

    Raises:
        SignatureInvalid: the copy fails its signature (changed after registration): never
            silently compared with.
    """
    import tempfile

    from trainpipe.contract.errors import InputError, SignatureInvalid
    from trainpipe.services import tracking
    from trainpipe.services.serving.package import load_artifact

    what = what or f"champion models:/{version.name}/{version.version}"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            weights = download_weights(client, version, tmp, what=what)
        except SignatureInvalid:
            raise
        except Exception as exc:  # noqa: BLE001 (a foreign version or an artifact store hiccup: the caller goes on without it)
            return None, f"its weights-only copy cannot be read: {tracking.first_line(exc)}"
        try:
            return load_artifact(weights, runtime, what), ""
        except InputError as exc:
            return None, str(exc)


def _weights_location(client: Any, version: Any) -> tuple[str, str]:
    model_id = logged_model_id(version)
    if model_id is None:
        raise ValueError(
            f"version {version.version} was not registered from a trainpipe model (source {version.source})"
        )
    return model_id, client.get_logged_model(model_id).artifact_location.rstrip("/")


def download_weights(
    client: Any, version: Any, dest: str | Path, *, what: str | None = None, verify: bool = True
) -> Path:
    """Download a version's weights-only artifact (``model.safetensors`` or ``model.onnx``, and
    ``model.json``, inside its MLflow model at ``artifacts/model/``) into ``dest``, and verify its
    signature (``model.sig``, beside them) before anything reads it. Nothing is unpickled.

    Args:
        what: The model, for the errors (default ``models:/<name>/<version>``).
        verify: False only for register_model, which is about to sign it.

    Raises:
        ValueError: the version was not made from a trainpipe logged model.
        SignatureInvalid: the files differ from what was signed, the signature is not the one
            recorded on the version, or (where the platform verifies) there is none.
    """
    import mlflow

    from trainpipe.services import signing
    from trainpipe.services.serving.package import WEIGHTS_DIR

    _, location = _weights_location(client, version)
    path = Path(
        mlflow.artifacts.download_artifacts(artifact_uri=f"{location}/artifacts/{WEIGHTS_DIR}", dst_path=str(dest))
    )
    if verify:
        recorded = (getattr(version, "tags", None) or {}).get(signing.SIGNATURE_TAG)
        signing.verify(
            path,
            what or f"models:/{version.name}/{version.version}",
            required=signing.verification_required(),
            expected_digest=recorded,
        )
    return path


def version_meta(client: Any, version: Any) -> dict[str, Any]:
    """A registered version's model description (``model.json`` of its weights-only copy: task, columns, the
    split its held-out rows came from), read alone; ``{}`` when it cannot be read (a foreign version)."""
    import json
    import tempfile

    import mlflow

    from trainpipe.contract.layout import MODEL_META
    from trainpipe.services.serving.package import WEIGHTS_DIR

    try:
        _, location = _weights_location(client, version)
        with tempfile.TemporaryDirectory(prefix="trainpipe-meta-") as tmp:
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{location}/artifacts/{WEIGHTS_DIR}/{MODEL_META}", dst_path=tmp
            )
            return dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except Exception:  # noqa: BLE001 (nothing to compare with: the caller says so)
        return {}


def verify_version(client: Any, version: Any, what: str | None = None) -> str | None:
    """Download a version's weights-only copy and verify it against its signature, reading nothing
    else: the signature's sha256, or None when it is unsigned (and the platform allows that).

    Raises:
        ValueError: the version was not made from a trainpipe logged model.
        SignatureInvalid: as :func:`download_weights`.
    """
    import tempfile

    from trainpipe.contract.io import file_digest
    from trainpipe.services import signing

    with tempfile.TemporaryDirectory(prefix="trainpipe-verify-") as tmp:
        signature = download_weights(client, version, tmp, what=what) / signing.SIGNATURE_FILE
        return file_digest(signature, "sha256") if signature.is_file() else None


def sign_version(client: Any, name: str, version: str, model_sha256: str, model_file: str) -> str:
    """Sign a registered version's weights-only copy as the registry holds it, and record it: the
    signature beside the files in the artifact store, its sha256 in the version's tags. A version
    already signed is verified instead (a rerun signs nothing twice).

    Args:
        model_file: The file whose sha256 must be ``model_sha256`` (what the gate passed): a copy
            changed before signing is never signed.

    Returns:
        The signature's sha256.

    Raises:
        InputError: the copy is not the model that passed the gate; the key cannot be used.
        SignatureInvalid: an earlier signature of this version fails.
    """
    import tempfile

    from trainpipe.contract.errors import InputError
    from trainpipe.contract.io import file_digest
    from trainpipe.services import signing
    from trainpipe.services.serving.package import WEIGHTS_DIR

    mv = client.get_model_version(name, version)
    if mv.tags.get(signing.SIGNATURE_TAG):
        verify_version(client, mv, f"models:/{name}/{version}")
        return str(mv.tags[signing.SIGNATURE_TAG])
    with tempfile.TemporaryDirectory(prefix="trainpipe-sign-") as tmp:
        weights = download_weights(client, mv, Path(tmp) / "copy", verify=False)
        if file_digest(weights / model_file, "sha256") != model_sha256:
            raise InputError(
                f"model: the registry's copy of models:/{name}/{version} is not the model that passed the gate; not "
                "signed"
            )
        stage = Path(tmp) / "stage" / "artifacts" / WEIGHTS_DIR
        stage.mkdir(parents=True)
        sha = signing.sign(weights, stage / signing.SIGNATURE_FILE)
        model_id, _ = _weights_location(client, mv)
        client.log_model_artifacts(model_id, str(Path(tmp) / "stage"))
    client.set_model_version_tag(name, version, signing.SIGNATURE_TAG, sha)
    return sha
