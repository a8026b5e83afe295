"""``trainpipe promote``: a person moves the serving alias to a registered version, after the fact.

With ``require_approval``, register_model registers the challenger only. Later, someone who may
approve runs ``trainpipe promote models:/<name>/<version> --reason ...`` (Kubeflow has no
human-in-the-loop step), or the Airflow DAG's approval task answers for them. Either way the same
function decides: the version must carry a gate decision that passed (its ``lineage.evaluation``
tags) and its model must verify against its signature when it has one (or the platform requires
one); then the alias moves (and the optimized variant's with it), the version is tagged with who
approved, when and why, and the audit log gets a ``promote`` record. A rejection (or an approval
that timed out) moves nothing and is tagged and audited the same way.

mlflow is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from typing import Any

from trainpipe.contract.errors import InputError, TrainpipeError
from trainpipe.services import registry

URI = re.compile(r"^models:/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)/(?P<version>\d+)$")
#: The tags a decision leaves on the version.
APPROVAL_TAGS = (
    "trainpipe.approval.decision",
    "trainpipe.approval.by",
    "trainpipe.approval.at",
    "trainpipe.approval.reason",
)
GATE_TAG = "lineage.evaluation.passed"


class PromotionRefused(TrainpipeError):
    """The version may not serve: its gate did not pass, or it carries no gate decision."""

    exit_code = 4  # the gate's own code: a failed gate is permanent


def promote(
    model_uri: str,
    reason: str,
    *,
    alias: str = registry.DEFAULT_ALIAS,
    decision: str = "approved",
    approver: str | None = None,
    tracking_uri: str | None = None,
    policy: Any = None,
    run: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Move ``alias`` to the version (approved), or record that it was rejected.

    Args:
        model_uri: ``models:/<name>/<version>``: a version, never an alias (what is approved is fixed).
        reason: Why, in the approver's words: it goes into the tags and the audit log.
        alias: The serving alias.
        decision: ``approved`` or ``rejected`` (a rejection moves nothing).
        approver: Who decided (Airflow's responding user); default: the caller's identity.
        tracking_uri: MLflow (default ``MLFLOW_TRACKING_URI``).
        policy: The platform policy (its artifact-store and tracking rules, its audit log).
        run: ``{"orchestrator", "run_id"}`` for the audit record (default: ``TRAINPIPE_ORCHESTRATOR`` and
            ``TRAINPIPE_RUN_ID``, which a DAG's task sets; else manual).

    Returns:
        What was done: version, alias, previous holder, decision, approver, signature.

    Raises:
        InputError: a malformed URI, an unknown version, an empty reason.
        PromotionRefused: the version's gate did not pass (or it carries no gate decision).
        SignatureInvalid: its model fails its signature.
        ServiceUnavailable: MLflow cannot be reached.
    """
    from mlflow.exceptions import MlflowException

    from trainpipe.contract import audit
    from trainpipe.services import tracking

    m = URI.match(model_uri)
    if not m:
        raise InputError(f"model_uri: {model_uri!r} is not models:/<name>/<version> (promote a version, not an alias)")
    if decision not in ("approved", "rejected"):
        raise InputError(f"decision: {decision!r} is not approved or rejected")
    if not reason.strip():
        raise InputError("reason: empty; say why the version may (or may not) serve")
    name, version = m["name"], m["version"]
    who = {"identity": approver, "source": "approver"} if approver else audit.identity()
    client = tracking.connect(tracking_uri, policy)
    try:
        mv = client.get_model_version(name, version)
    except MlflowException as exc:
        raise InputError(f"model_uri: {model_uri}: {tracking.first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001
        raise tracking.classify(exc, f"tracking_uri: reading {model_uri}", "failed") from None
    gate = mv.tags.get(GATE_TAG)
    optimized = mv.tags.get(registry.OPTIMIZED_TAG)
    signature = _may_serve(client, mv, model_uri, gate, optimized) if decision == "approved" else None
    # the holder read and the alias moved under the lease register_model's compare-and-set holds too
    with registry.alias_lease(client, name) if decision == "approved" else contextlib.nullcontext():
        previous = registry.alias_version(client, name, alias)
        record = {
            "model_name": name,
            "version": version,
            "alias": alias,
            "decision": decision,
            "approver": who["identity"],
            "reason": reason,
            "previous_version": str(previous.version) if previous is not None else None,
            "gate_passed": gate,
            "signature_sha256": signature,
        }
        _apply(client, record, optimized, model_uri)
    log = audit.log_path(getattr(policy, "audit_log", None))
    if log is not None:
        run = run or {
            "orchestrator": os.environ.get("TRAINPIPE_ORCHESTRATOR") or "manual",
            "run_id": os.environ.get("TRAINPIPE_RUN_ID"),
        }
        action = "promote" if decision == "approved" else "reject"
        audit.append(log, [{"component": "promote", "who": who, "action": action, "run": run, "decision": record}])
    return record


def _may_serve(client: Any, mv: Any, model_uri: str, gate: str | None, optimized: str | None) -> str | None:
    """A version may serve when its gate passed and its model (and its optimized variant, which
    serves beside it) verify against their signatures: the model's signature digest.

    Raises:
        PromotionRefused: the gate did not pass, or the version carries no gate decision.
        SignatureInvalid: the model or its variant fails its signature.
        InputError: the version or its variant cannot be read.
    """
    from trainpipe.contract.errors import ServiceUnavailable, SignatureInvalid
    from trainpipe.services import tracking

    if gate is None:
        raise PromotionRefused(
            f"model_uri: {model_uri} carries no gate decision ({GATE_TAG}): it was not registered by the pipeline; "
            "not promoted"
        )
    if gate.lower() != "true":
        raise PromotionRefused(
            f"model_uri: {model_uri} did not pass its gate (evaluate_model's decision it carries); not promoted"
        )
    try:
        signature = registry.verify_version(client, mv, model_uri)
    except ValueError as exc:
        raise InputError(f"model_uri: {exc}") from None
    if optimized:
        opt_name, opt_version = optimized.rsplit("/", 1)
        try:
            registry.verify_version(client, client.get_model_version(opt_name, opt_version), f"models:/{optimized}")
        except (SignatureInvalid, ServiceUnavailable):
            raise
        except Exception as exc:  # noqa: BLE001
            raise InputError(
                f"model_uri: its optimized variant models:/{optimized} cannot be read: {tracking.first_line(exc)}"
            ) from None
    return signature


def _apply(client: Any, record: dict[str, Any], optimized: str | None, model_uri: str) -> None:
    """The decision on the version's tags; approved, the alias moved to it (and to its optimized variant)."""
    from trainpipe.services import tracking

    name, version, decision = record["model_name"], record["version"], record["decision"]
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    values = (decision, record["approver"], now, record["reason"][:5000])
    try:
        for key, value in zip(APPROVAL_TAGS, values, strict=True):
            client.set_model_version_tag(name, version, key, value)
        if decision == "approved":
            client.set_registered_model_alias(name, record["alias"], version)
            if optimized:  # the optimized variant serves beside it under the same alias
                opt_name, opt_version = optimized.rsplit("/", 1)
                client.set_registered_model_alias(opt_name, record["alias"], opt_version)
                record["optimized_version"] = optimized
    except Exception as exc:  # noqa: BLE001
        raise tracking.classify(exc, f"tracking_uri: promoting {model_uri}", "failed") from None


def summary(record: dict[str, Any]) -> str:
    """One line for the terminal and the task log."""
    uri = f"models:/{record['model_name']}/{record['version']}"
    if record["decision"] != "approved":
        rejected = f"{uri} rejected by {record['approver']}: {record['reason']}"
        return f"trainpipe promote: {rejected} ({record['alias']} not moved)"
    was = f" (was version {record['previous_version']})" if record.get("previous_version") else ""
    return (
        f"trainpipe promote: {uri} is now {record['alias']}{was}, approved by {record['approver']}: {record['reason']}"
    )
