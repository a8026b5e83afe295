"""Find what a local run produced, for the summary ``trainpipe run`` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainpipe.contract.artifacts import MARKER
from trainpipe.contract.io import read_json


def collect_results(root: str | Path, since: float = 0.0) -> dict[str, dict[str, Any]]:
    """The newest completed output of each component under ``root`` (written after ``since``)."""
    found: dict[str, tuple[float, dict[str, Any]]] = {}
    for marker in Path(root).rglob(MARKER):
        mtime = marker.stat().st_mtime
        if mtime < since:
            continue
        doc = read_json(marker)
        name = doc.get("component", "")
        if name and (name not in found or found[name][0] < mtime):
            doc["result"]["_path"] = str(marker.parent)
            found[name] = (mtime, doc["result"])
    return {k: v for k, (_, v) in found.items()}


def describe(results: dict[str, dict[str, Any]], tracking_uri: str, pipeline_yaml: str | None = None) -> str:
    """Where everything is, as a few lines for a person."""
    lines = []
    reg = results.get("register_model")
    drift = results.get("detect_drift")
    if drift and not drift.get("retrain"):
        lines.append(f"registered model : none (not retrained: {drift['reasons'][0]})")
    elif reg and reg.get("registered"):
        lines.append(
            f"registered model : {reg['model_name']} version {reg['version']} alias @{reg['alias']} "
            f"({'new' if reg['created'] else 'existing version, nothing duplicated'})"
        )
    elif reg:
        lines.append(f"registered model : none ({reg.get('reason')})")
    else:
        lines.append("registered model : none (the gate did not pass, or the run stopped early)")
    lines.append(f"MLflow tracking  : {tracking_uri}")
    if tracking_uri.startswith("sqlite:///"):
        db = tracking_uri[len("sqlite:///") :]
        lines.append(
            f"look at it with  : mlflow ui --backend-store-uri {tracking_uri} --default-artifact-root "
            f"{Path(db).parent / 'mlartifacts'}"
        )
    else:
        lines.append(f"look at it with  : open {tracking_uri}")
    if "snapshot_dataset" in results:
        s = results["snapshot_dataset"]
        lines.append(f"DVC snapshot     : md5 {s['md5']} rev {s['rev'][:12]} remote {s['remote_url']}")
    if drift:
        lines.append(
            f"drift report     : {Path(drift['_path']) / 'report.html'} ({len(drift['drifted_columns'])} of "
            f"{len(drift['columns'])} columns drifted; "
            f"{'retrain' if drift['retrain'] else 'no retrain'})"
        )
    if "optimize_model" in results:
        o = results["optimize_model"]
        lines.append(
            f"optimization     : {Path(o['_path']) / 'report.html'} ({o['selected'] or 'no variant accepted'})"
        )
    if reg and reg.get("optimized_model_uri"):
        lines.append(f"optimized model  : {reg['optimized_model_uri']} (loads with MLflow + onnxruntime)")
    if "validate_data" in results:
        v = results["validate_data"]
        lines.append(f"validation report: {Path(v['_path']) / v['docs_index']}")
    if "evaluate_model" in results:
        e = results["evaluate_model"]
        shown = ", ".join(f"{k} {v:.4f}" for k, v in list(e["metrics"].items())[:3])
        lines.append(f"evaluation report: {Path(e['_path']) / 'report.html'} ({shown})")
    if "profile_training" in results:
        p = results["profile_training"]
        lines.append(f"profiling report : {Path(p['_path']) / p['report']} ({p['samples_per_second']:,.0f} samples/s)")
    if pipeline_yaml:
        lines.append(f"KFP pipeline YAML: {pipeline_yaml}")
    return "\n".join(lines)
