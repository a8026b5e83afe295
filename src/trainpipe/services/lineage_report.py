"""``trainpipe lineage``: the chain from a registered model version back to the raw data,
and a check that the data snapshot can still be fetched from its DVC remote with the
hash the lineage recorded. mlflow and dvc are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from trainpipe.contract.errors import InputError, ServiceUnavailable, TrainpipeError

URI = re.compile(
    r"^models:/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<alias>[A-Za-z][A-Za-z0-9_-]*)|/(?P<version>\d+))$"
)


class LineageBroken(TrainpipeError):
    """The recorded lineage does not check out (the data cannot be fetched, or its hash changed)."""

    exit_code = 3


def fetch(model_uri: str, tracking_uri: str | None) -> tuple[Any, dict[str, Any]]:
    """The model version and its ``lineage.json`` (from the version's training run).

    Raises:
        InputError: a malformed URI, or an unknown model, alias or version.
        ServiceUnavailable: MLflow cannot be reached.
    """
    m = URI.match(model_uri)
    if not m:
        raise InputError(f"model_uri: {model_uri!r} is not models:/<name>@<alias> or models:/<name>/<version>")
    from mlflow.exceptions import MlflowException

    from trainpipe.services import registry, tracking

    client = tracking.connect(tracking_uri)
    try:
        if m["alias"]:
            version = registry.alias_version(client, m["name"], m["alias"])
            if version is None:
                raise InputError(f"model_uri: {m['name']!r} has no alias {m['alias']!r}")
        else:
            version = client.get_model_version(m["name"], m["version"])
    except MlflowException as exc:
        raise InputError(f"model_uri: {model_uri}: {str(exc).splitlines()[0]}") from None
    run_id = version.tags.get(registry.RUN_TAG) or version.run_id
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=f"runs:/{run_id}/trainpipe/lineage.json", dst_path=tmp
            )
        except Exception as exc:
            raise InputError(
                f"model_uri: version {version.version} has no trainpipe lineage ({tracking.first_line(exc)})"
            ) from None
        return version, json.loads(Path(path).read_text(encoding="utf-8"))


def verify_snapshot(lineage: dict[str, Any]) -> dict[str, Any]:
    """Fetch the snapshot from its DVC remote into an empty cache and compare its md5.

    Returns:
        ``{"ok": bool, "message": str, "md5": ...}``.
    """
    snap = lineage.get("snapshot") or {}
    if not all(snap.get(k) for k in ("md5", "rev", "path", "repo", "remote")):
        return {"ok": False, "message": "the lineage has no complete DVC snapshot record"}
    import dvc.api

    digest = hashlib.md5()
    with tempfile.TemporaryDirectory() as cache:
        try:
            # An empty cache: the bytes come from the remote, not from a local copy.
            with dvc.api.open(
                snap["path"],
                repo=snap["repo"],
                rev=snap["rev"],
                mode="rb",
                config={
                    "cache": {"dir": cache},
                    "core": {"remote": "verify"},
                    "remote": {"verify": {"url": snap["remote"]}},
                },
            ) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return {
                "ok": False,
                "message": f"snapshot {snap['path']}@{snap['rev'][:10]} cannot be fetched from {snap['remote']}: "
                f"{first}",
            }
    got = digest.hexdigest()
    if got != snap["md5"]:
        return {
            "ok": False,
            "md5": got,
            "message": f"snapshot {snap['path']} fetched from {snap['remote']} has md5 {got}, the lineage recorded "
            f"{snap['md5']}: the remote's copy changed",
        }
    return {
        "ok": True,
        "md5": got,
        "message": f"snapshot {snap['path']}@{snap['rev'][:10]} fetched from {snap['remote']}: md5 {got} matches",
    }


def render(name: str, version: Any, lineage: dict[str, Any], check: dict[str, Any] | None) -> str:
    """The chain, newest first: model version → gate → evaluation → training (and what it cost) →
    snapshot → validation → features (when the data came from a feature store) → raw data (the
    dataset validated, or the entity table a training set was joined from)."""
    reg, ev, tr = lineage.get("registration", {}), lineage.get("evaluation", {}), lineage.get("training", {})
    prof, snap, val, src = (
        lineage.get("training_profile", {}),
        lineage.get("snapshot", {}),
        lineage.get("validation", {}),
        lineage.get("source", {}),
    )
    code, orch = lineage.get("code", {}), lineage.get("orchestrator", {})
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in (ev.get("metrics") or {}).items() if isinstance(v, (int, float)))
    feats = lineage.get("features")
    # with features the raw data is the entity table; records from before ``source`` described it held the
    # set's md5 there, so its own is read from ``features`` (which holds it in every record)
    raw_md5 = (feats or {}).get("entity_md5") or src.get("md5", "-")
    lines = [
        f"model      {name} version {version.version}  aliases: {', '.join(sorted(version.aliases)) or '-'}",
        f"  gate       {'passed' if ev.get('passed') else 'NOT passed'}; {ev.get('alias') or 'champion'} compared: "
        f"version {ev.get('champion_version') or '-'}, beats it: {ev.get('beats_champion', False)}",
        f"  evaluation {metrics} on {ev.get('n_test')} held-out rows",
        f"  profiled   {prof.get('samples_per_second', '-')} samples/s, step {prof.get('step_time_ms', '-')} ms",
        f"  training   MLflow run {tr.get('mlflow_run_id')}: {tr.get('backend')} x{tr.get('world_size')} on "
        f"{tr.get('device')} ({tr.get('dist_backend')}), hardware profile {tr.get('hardware_profile', '-')}, "
        f"{tr.get('precision', 'fp32')}, model sha256 {str(tr.get('model_sha256', ''))[:16]}…",
        f"  cost       {_cost(tr, prof, lineage.get('tuning') or {})}",
        f"  snapshot   DVC md5 {snap.get('md5')} rev {str(snap.get('rev', ''))[:10]} path {snap.get('path')} remote "
        f"{snap.get('remote')}"
        if snap
        else "  snapshot   none: no snapshot_dataset ran (the training data cannot be fetched again)",
        f"  validation suite {val.get('suite', '-')}: "
        f"{'passed' if val.get('success', val.get('passed')) else val.get('success', '-')}",
        f"  raw data   {src.get('uri', '-')} md5 {raw_md5}",
        f"  code       git {code.get('git_commit', '-')} trainpipe {code.get('trainpipe', '-')}, image "
        f"{lineage.get('image', '-')}",
        f"  run        {orch.get('name', '-')} {orch.get('run_id', '')}",
    ]
    if reg:
        lines.insert(1, f"  registered {reg.get('model_name')} v{reg.get('version')}")
    if feats:
        at = next(i for i, line in enumerate(lines) if line.startswith("  raw data"))
        lines[at:at] = _feature_lines(feats)
    if check is not None:
        lines.append(f"verify     {'OK' if check['ok'] else 'FAILED'}: {check['message']}")
    return "\n".join(lines)


def _money(value: float, currency: str | None, digits: int = 4) -> str:
    return f"{value:.{digits}f} {currency}" if currency else f"{value:.{digits}f}"


def _cost(training: dict[str, Any], profile: dict[str, Any], tuning: dict[str, Any]) -> str:
    """What the model cost: its training at the hardware profile's prices and what it used, the
    tuning study's trials, and the profiled cost per epoch (each when the record has it)."""
    parts = []
    if training:
        used = ", ".join(
            f"{training[key]:g} {unit}"
            for key, unit in (
                ("wall_seconds", "s wall"),
                ("gpu_seconds", "GPU-seconds"),
                ("cpu_core_seconds", "CPU-core-seconds"),
            )
            if isinstance(training.get(key), (int, float))
        )
        parts.append(
            f"training {_money(training['cost'], training.get('currency'))}"
            if training.get("cost") is not None
            else f"training not priced: hardware profile {training.get('hardware_profile', '-')} declares no prices"
        )
        parts[-1] += f" ({used})" if used else ""
    if tuning.get("cost") is not None:
        parts.append(f"tuning study {_money(tuning['cost'], tuning.get('currency'))}")
    if profile.get("cost_per_epoch") is not None:
        parts.append(f"{_money(profile['cost_per_epoch'], profile.get('currency'), 6)} per epoch when profiled")
    return "; ".join(parts) or "-"


def _feature_lines(feats: dict[str, Any]) -> list[str]:
    """Which features, as of when: the Feast repository, each view with its definition's fingerprint,
    and the entity table's timestamps."""
    service = f" service {feats['service']}" if feats.get("service") else ""
    lines = [
        f"  features   Feast project {feats.get('project')}{service} at {feats.get('repo')}, as of "
        f"{feats.get('as_of_min')} .. {feats.get('as_of_max')} ({feats.get('timestamp_column')}), entity table md5 "
        f"{feats.get('entity_md5')}"
    ]
    for name, view in sorted((feats.get("views") or {}).items()):
        lines.append(
            f"    view     {name}: {', '.join(view.get('features') or [])} (definition sha256 "
            f"{str(view.get('fingerprint', ''))[:16]}…)"
        )
    return lines


def verify_signature(version: Any, tracking_uri: str | None) -> str | None:
    """The version's model, downloaded and checked against its signature: its sha256, or None
    when it is unsigned (and the platform allows that).

    Raises:
        SignatureInvalid: the registry's copy was changed after signing (or is unsigned where
            the platform verifies).
    """
    from trainpipe.services import registry, tracking

    try:
        return registry.verify_version(tracking.connect(tracking_uri), version)
    except ValueError as exc:  # not a trainpipe model: nothing of ours to verify
        raise InputError(f"model_uri: {exc}") from None


def lineage_command(model_uri: str, tracking_uri: str | None, as_json: bool, verify: bool) -> tuple[str, bool]:
    """What ``trainpipe lineage`` prints, and whether verification passed. The model's signature
    is verified first: a changed model is refused (exit 7) whatever its lineage says."""
    version, lineage = fetch(model_uri, tracking_uri)
    signature = verify_signature(version, tracking_uri)
    check = verify_snapshot(lineage) if verify else None
    name = URI.match(model_uri)["name"]  # type: ignore[index]
    if as_json:
        doc = {
            "model": {
                "name": name,
                "version": str(version.version),
                "aliases": sorted(version.aliases),
                "signature_sha256": signature,
            },
            "lineage": lineage,
            "verification": check,
        }
        return json.dumps(doc, indent=2, sort_keys=True, default=str), check is None or check["ok"]
    text = render(name, version, lineage, check)
    sig_line = f"  signature  {'verified, sha256 ' + signature[:16] + '…' if signature else 'none (unsigned)'}"
    lines = text.splitlines()
    return "\n".join([lines[0], sig_line, *lines[1:]]), check is None or check["ok"]


__all__ = ["LineageBroken", "ServiceUnavailable", "fetch", "lineage_command", "render", "verify_snapshot"]
