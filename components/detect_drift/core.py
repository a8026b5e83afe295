"""detect_drift: the work. pandas, scipy, dvc and mlflow are imported inside the functions.

The reference is the data that trained the current champion: its registered version's lineage
names the DVC snapshot (md5, git revision, path, remote), fetched here into an empty cache, so the
bytes come from the remote and match what training read. An explicit ``reference`` wins.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import tempfile
import time
from pathlib import Path
from typing import Any

from trainpipe.components.detect_drift.spec import (
    NAME,
    REPORT_FILE,
    RESULT_FILE,
    ColumnResult,
    DetectDriftConfig,
    DetectDriftResult,
    ReferenceInfo,
)
from trainpipe.contract.errors import InputError, ServiceUnavailable
from trainpipe.contract.io import atomic_write_json, atomic_write_text
from trainpipe.contract.lineage import DriftLineage, Lineage
from trainpipe.contract.runtime import Runtime
from trainpipe.services import registry

#: The report draws the drifted columns first, then the most moved, up to this many charts.
MAX_CHARTS = 200


def fetch_snapshot(snap: dict[str, Any], dest: Path) -> Path:
    """The lineage's DVC snapshot (a file or a folder), fetched from its remote into an empty cache.

    Raises:
        InputError: the record is incomplete, or its git repository, revision or path is not there
            (exit 2: a retry cannot fix it).
        ServiceUnavailable: the remote cannot serve the bytes (exit 75: retried).
    """
    missing = [k for k in ("md5", "rev", "path", "repo", "remote") if not snap.get(k)]
    if missing:
        raise InputError(
            f"model_name: the champion's lineage has no complete DVC snapshot record (no {', '.join(missing)}); give "
            "reference"
        )
    from dvc.api import DVCFileSystem

    from trainpipe.services.tracking import first_line

    where = f"snapshot {snap['path']}@{str(snap['rev'])[:10]}"
    cache = dest / ".cache"
    config = {
        "cache": {"dir": str(cache)},
        "core": {"remote": "lineage"},
        "remote": {"lineage": {"url": snap["remote"]}},
    }
    try:
        fs = DVCFileSystem(snap["repo"], rev=snap["rev"], config=config)
        found = fs.exists(snap["path"])
    except Exception as exc:
        raise InputError(f"model_name: {where} in {snap['repo']}: {first_line(exc)}") from None
    if not found:
        raise InputError(f"model_name: {where} is not in {snap['repo']} at that revision")
    target = dest / Path(snap["path"]).name
    try:
        fs.get(snap["path"], str(target), recursive=True)
    except Exception as exc:
        raise ServiceUnavailable(
            f"reference: {where} cannot be fetched from {snap['remote']}: {first_line(exc)}"
        ) from None
    if target.is_file():
        digest = hashlib.md5()
        with target.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != snap["md5"]:
            raise InputError(
                f"reference: {where} fetched from {snap['remote']} has md5 {digest.hexdigest()}, the lineage recorded "
                f"{snap['md5']}"
            )
    return target


def champion(config: DetectDriftConfig, runtime: Runtime) -> tuple[registry.Champion, dict[str, Any]] | None:
    """The version serving under the alias and its lineage; None when the model has no such alias yet."""
    if not config.model_name:
        return None
    holder = registry.champion(config.tracking_uri, config.model_name, config.alias, runtime)
    if holder is None:
        return None
    from trainpipe.services import lineage_report

    try:
        _, record = lineage_report.fetch(f"models:/{config.model_name}/{holder.number}", config.tracking_uri)
    except InputError:
        raise InputError(
            f"model_name: champion version {holder.number} of {config.model_name!r} has no trainpipe lineage to name "
            "the data it was trained on; give reference"
        ) from None
    return holder, record


def _champion_model(holder: registry.Champion) -> tuple[Any, str | None]:
    """The champion's model (weights only) to score both sides with, or why it is not used."""
    model, why = holder.model()
    return model, None if model is not None else f"the champion's predictions were not compared: {why}"


def _predictions(model: Any, ref: Any, cur: Any, config: DetectDriftConfig) -> ColumnResult | None:
    import numpy as np
    import pandas as pd

    from trainpipe.data.drift import compare

    cols = model.feature_columns
    if any(c not in ref.columns or c not in cur.columns for c in cols):
        return None
    sides = []
    for df in (ref, cur):
        x = df[cols].to_numpy(dtype=np.float32)
        if model.task == "classification":
            index = model.predict_proba(x).argmax(axis=1)
            names = (
                np.asarray([str(c) for c in model.classes], dtype=object)[index] if model.classes else index.astype(str)
            )
            sides.append(pd.DataFrame({"prediction": names}))
        else:
            sides.append(pd.DataFrame({"prediction": np.asarray(model.predict_values(x), dtype=np.float64)}))
    got = compare(sides[0], sides[1], sample_size=config.sample_size, seed=config.seed).columns[0]
    return dataclasses.replace(got, column="prediction")


def _svg(title: str, groups: list[str], ref: Any, cur: Any, ticks: tuple[str, str] | None) -> str:
    """A bar chart as SVG, reference and current side by side per group (a bin or a category).

    Drawn here rather than with matplotlib: one chart a column, for every column, costs well under
    a millisecond each this way, and several seconds for a wide table with matplotlib."""
    w, h, left, right, top, bottom = 380, 210, 36, 8, 24, 42
    pw, ph = w - left - right, h - top - bottom
    peak = max(float(max(ref, default=0)), float(max(cur, default=0)), 1e-12)
    n = max(len(groups), 1)
    step = pw / n
    bar = step * (0.42 if ticks is None else 0.5)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'font-family="sans-serif" font-size="10">',
        f'<text x="{w / 2}" y="14" text-anchor="middle" font-size="11">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#444"/>',
        f'<text x="{left - 3}" y="{top + 8}" text-anchor="end">{peak:.2g}</text>',
    ]
    for i in range(len(groups)):
        x = left + i * step
        for k, (values, colour) in enumerate(((ref, "#1f77b4"), (cur, "#ff7f0e"))):
            v = float(values[i]) / peak * ph
            dx = (step - 2 * bar) / 2 + k * bar if ticks is None else 0.0
            parts.append(
                f'<rect x="{x + dx:.2f}" y="{top + ph - v:.2f}" width="{max(bar if ticks is None else step, 0.5):.2f}" '
                f'height="{v:.2f}" fill="{colour}" fill-opacity="{0.9 if ticks is None else 0.5}"/>'
            )
        if ticks is None and n <= 30:
            label = html.escape(groups[i][:12])
            parts.append(
                f'<text transform="translate({x + step / 2:.1f},{top + ph + 8}) rotate(45)" '
                f'font-size="8">{label}</text>'
            )
    if ticks is not None:
        parts.append(f'<text x="{left}" y="{top + ph + 12}">{html.escape(ticks[0])}</text>')
        parts.append(f'<text x="{left + pw}" y="{top + ph + 12}" text-anchor="end">{html.escape(ticks[1])}</text>')
    parts.append(
        f'<rect x="{w - 150}" y="{h - 12}" width="9" height="9" fill="#1f77b4"/><text x="{w - 138}" '
        f'y="{h - 4}">reference</text>'
        f'<rect x="{w - 80}" y="{h - 12}" width="9" height="9" fill="#ff7f0e"/><text x="{w - 68}" '
        f'y="{h - 4}">current</text></svg>'
    )
    return "".join(parts)


def _charts(ref: Any, cur: Any, columns: list[ColumnResult]) -> list[tuple[str, str]]:
    """One chart per column, drifted first, then by how far they moved: both sides' histograms for
    a number (30 shared bins, as densities), each category's share for a category. SVG, base64."""
    import numpy as np

    def moved(c: ColumnResult) -> float:
        return (1.0 - c.statistic) if c.method in ("ks", "chisquare") else c.statistic

    out = []
    for c in sorted(columns, key=lambda c: (not c.drifted, -moved(c)))[:MAX_CHARTS]:
        r, k = ref[c.column].dropna(), cur[c.column].dropna()
        title = f"{c.column}: {c.method} {c.statistic:.3g}{' DRIFT' if c.drifted else ''}"
        if c.kind == "numeric":
            a, b = r.to_numpy(dtype=float), k.to_numpy(dtype=float)
            edges = np.histogram_bin_edges(np.concatenate([a, b]), bins=30)
            hr, hc = (np.histogram(v, bins=edges)[0] / max(len(v), 1) for v in (a, b))
            svg = _svg(title, [""] * 30, hr, hc, (f"{edges[0]:.3g}", f"{edges[-1]:.3g}"))
        else:
            rs, ks = r.astype(str).value_counts(normalize=True), k.astype(str).value_counts(normalize=True)
            keys = sorted(set(rs.index) | set(ks.index))[:30]
            svg = _svg(title, keys, [rs.get(v, 0.0) for v in keys], [ks.get(v, 0.0) for v in keys], None)
        out.append((c.column, base64.b64encode(svg.encode()).decode("ascii")))
    return out


def _report(result: DetectDriftResult, images: list[tuple[str, str]]) -> str:
    rows = "".join(
        f"<tr class='{'drifted' if c.drifted else 'stable'}'><th>{html.escape(c.column)}</th>"
        f"<td>{c.kind}</td><td>{c.method}</td>"
        f"<td>{c.statistic:.4g}</td><td>{c.threshold:.4g}</td><td>{'drift' if c.drifted else 'no'}</td></tr>"
        for c in result.columns + ([result.prediction] if result.prediction else [])
    )
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.reasons)
    ref = result.reference
    figs = "".join(
        f'<figure><img alt="{html.escape(t)}" '
        f'src="data:image/svg+xml;base64,{b}"><figcaption>{html.escape(t)}</figcaption></figure>'
        for t, b in images
    )
    sample = (
        f"sampled to {result.sample_size} rows a side with seed {result.seed}"
        if result.sampled
        else "every row compared"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trainpipe drift</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px "
        "8px;text-align:left}tr.drifted{background:#fdd}figure{display:inline-block}</style>"
        f"</head><body><h1>Drift: {'retrain' if result.retrain else 'no retrain'}</h1><ul id='reasons'>{reasons}</ul>"
        f"<p id='reference'>reference: {html.escape(ref.source)} {html.escape(ref.path or '')} ({ref.rows} rows"
        f"{', champion version ' + html.escape(ref.model_version) if ref.model_version else ''}); current: "
        f"{result.current_rows} rows; {sample}</p>"
        f"<h2>Columns ({len(result.drifted_columns)} of {len(result.columns)} drifted, share "
        f"{result.share_drifted:.3f}, "
        f"threshold {result.drift_share:.3f})</h2><table "
        "id='columns'><tr><th>column</th><th>kind</th><th>method</th><th>statistic</th>"
        f"<th>threshold</th><th>drift</th></tr>{rows}</table><h2>Distributions</h2>{figs}</body></html>\n"
    )


def _log_to_mlflow(config: DetectDriftConfig, result: DetectDriftResult, out: Path, runtime: Runtime) -> None:
    from trainpipe.services import tracking

    client = tracking.connect(config.tracking_uri, runtime.policy)
    experiment = tracking.ensure_experiment(client, config.drift_experiment, config.tracking_uri or "")
    tags = {"trainpipe.component": NAME, "trainpipe.reference": result.reference.source}
    if config.model_name:
        tags["trainpipe.model_name"] = config.model_name
    if result.reference.model_version:
        tags["trainpipe.champion_version"] = result.reference.model_version
    run = client.create_run(experiment, run_name="detect-drift", tags=tags)
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    metrics = [
        Metric("share_drifted", result.share_drifted, now, 0),
        Metric("dataset_drift", float(result.dataset_drift), now, 0),
        Metric("retrain", float(result.retrain), now, 0),
    ]
    metrics += [Metric(f"drift.{_metric_name(c.column)}", c.statistic, now, 0) for c in result.columns[:900]]
    params = [
        Param("drift_share", str(config.drift_share)),
        Param("sample_size", str(config.sample_size)),
        Param("seed", str(config.seed)),
    ]
    client.log_batch(run.info.run_id, metrics=metrics, params=params)
    client.log_artifact(run.info.run_id, str(out / RESULT_FILE), "drift")
    client.log_artifact(run.info.run_id, str(out / REPORT_FILE), "drift")
    client.set_terminated(run.info.run_id)


def _metric_name(column: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", column)[:200]


def detect_drift(config: DetectDriftConfig, lineage: Lineage, runtime: Runtime | None = None) -> DetectDriftResult:
    """Compare the new snapshot with the champion's training data; decide whether to retrain.

    Args:
        config: Settings and paths.
        lineage: The new snapshot's lineage; ``drift`` is added.
        runtime: The platform's settings (the team packages whose model code may be imported, the
            policy MLflow is reached under).

    Returns:
        Per column and for the data set: the statistic, its threshold and whether it drifted; the
        champion's prediction drift; whether to retrain and why (also ``drift.json``, ``report.html``).

    Raises:
        InputError: the schemas differ, a side has no rows, the champion's lineage names no snapshot,
            or a setting names a column the data lacks.
        ServiceUnavailable: MLflow or the snapshot's DVC remote cannot be reached (retry).
    """
    from trainpipe.data import drift
    from trainpipe.data.tabular import read_table

    runtime = runtime or Runtime()
    if not config.reference and not config.model_name:
        raise InputError(
            "reference: give the reference data, or model_name to compare with its champion's training snapshot"
        )
    out = Path(config.output_dir)
    current = read_table(config.data, "data")
    found = champion(config, runtime)
    holder, record = found if found is not None else (None, {})
    age = holder.age_days if holder is not None else None
    reference, info = _reference(config, holder, record)
    if holder is not None:
        info.model_version, info.champion_age_days = holder.number, round(age or 0.0, 4)
    label = config.label_column if reference is not None and config.label_column in reference.columns else None
    if reference is None:
        return _finish(
            config,
            lineage,
            out,
            runtime,
            current,
            None,
            None,
            info,
            None,
            f"no champion of {config.model_name!r} under alias {config.alias!r}: nothing to compare with",
        )
    info.rows = len(reference)
    _check_columns(config, reference)
    result = drift.compare(
        reference,
        current,
        label=label,
        categorical=config.categorical_columns,
        drift_share=config.drift_share,
        methods=config.column_methods,
        thresholds=config.column_thresholds,
        sample_size=config.sample_size,
        seed=config.seed,
    )
    prediction, notes = _prediction_drift(config, holder, reference, current)
    return _finish(config, lineage, out, runtime, current, reference, result, info, prediction, None, notes)


def _finish(
    config: DetectDriftConfig,
    lineage: Lineage,
    out: Path,
    runtime: Runtime,
    current: Any,
    reference: Any,
    result: Any,
    info: ReferenceInfo,
    prediction: ColumnResult | None,
    nothing: str | None,
    notes: list[str] | None = None,
) -> DetectDriftResult:
    retrain, reasons = _decide(config, result, prediction, info, nothing)
    reasons += notes or []
    cols = list(result.columns) if result is not None else []
    res = DetectDriftResult(
        dataset_drift=bool(result.dataset_drift) if result is not None else False,
        share_drifted=float(result.share_drifted) if result is not None else 0.0,
        drift_share=config.drift_share,
        drifted_columns=result.drifted_columns if result is not None else [],
        columns=cols,
        prediction=prediction,
        reference=info,
        current_rows=len(current),
        sampled=bool(result.sampled) if result is not None else False,
        sample_size=config.sample_size,
        seed=config.seed,
        retrain=retrain,
        reasons=reasons,
    )
    images = (
        _charts(drift_sample(reference, config, 0), drift_sample(current, config, 1), cols)
        if reference is not None
        else []
    )
    atomic_write_json(out / RESULT_FILE, res.model_dump(mode="json", exclude={"lineage"}))
    atomic_write_text(out / REPORT_FILE, _report(res, images))
    if config.model_name or config.tracking_uri:
        _log_to_mlflow(config, res, out, runtime)
    snap = info.snapshot or {}
    res.lineage = Lineage.of(lineage).with_(
        drift=DriftLineage(
            dataset_drift=res.dataset_drift,
            share_drifted=round(res.share_drifted, 6),
            drifted_columns=res.drifted_columns,
            retrain=retrain,
            reference=info.source,
            champion_version=info.model_version,
            reference_md5=snap.get("md5"),
        )
    )
    return res


def _reference(config: DetectDriftConfig, holder: Any, record: dict[str, Any]) -> tuple[Any, ReferenceInfo]:
    """The reference table and where it came from: the one given, or the champion's training snapshot fetched
    from its DVC remote; none when there is no champion.

    Raises:
        InputError: the champion's lineage names no snapshot.
        ServiceUnavailable: the snapshot's DVC remote cannot be reached.
    """
    from trainpipe.data.tabular import read_table

    with tempfile.TemporaryDirectory() as tmp:
        if config.reference:
            return read_table(config.reference, "reference"), ReferenceInfo(source="explicit", path=config.reference)
        if holder is None:
            return None, ReferenceInfo(source="none")
        snap = record.get("snapshot") or {}
        if not snap:
            raise InputError(
                f"model_name: version {holder.number} of {config.model_name!r} has a lineage without a DVC "
                "snapshot; give reference"
            )
        path = fetch_snapshot(snap, Path(tmp))
        info = ReferenceInfo(source="lineage", path=f"{snap['path']}@{str(snap['rev'])[:10]}", snapshot=snap)
        return read_table(path, "reference"), info


def _check_columns(config: DetectDriftConfig, reference: Any) -> None:
    """Every column a setting names is one of the reference's.

    Raises:
        InputError: naming the first that is not.
    """
    for col in list(config.categorical_columns) + list(config.column_methods) + list(config.column_thresholds):
        if col not in reference.columns:
            raise InputError(
                f"categorical_columns/column_methods/column_thresholds: {col!r} is not a column of the reference"
            )


def _prediction_drift(
    config: DetectDriftConfig, holder: Any, reference: Any, current: Any
) -> tuple[ColumnResult | None, list[str]]:
    """The champion's predictions on both sides compared (none without a champion), and why they were not."""
    from trainpipe.data import drift

    if holder is None:
        return None, []
    model, why = _champion_model(holder)
    if model is None:
        return None, [why] if why else []
    ref_s, cur_s = (
        drift.sample(reference, config.sample_size, config.seed),
        drift.sample(current, config.sample_size, config.seed + 1),
    )
    return _predictions(model, ref_s, cur_s, config), []


def _decide(
    config: DetectDriftConfig, result: Any, prediction: ColumnResult | None, info: ReferenceInfo, nothing: str | None
) -> tuple[bool, list[str]]:
    """Whether to retrain, and why: nothing to compare with, the data's or the predictions' drift, the champion's
    age, or ``retrain_on: always``; else no drift, with the figures."""
    reasons: list[str] = []
    retrain = False
    if nothing is not None:
        retrain = True
        reasons.append(f"{nothing}: retrain")
    else:
        drifted = result.drifted_columns
        shown = ", ".join(drifted[:8]) + (" …" if len(drifted) > 8 else "")
        if result.dataset_drift:
            retrain = True
            reasons.append(
                f"data drifted: {len(drifted)} of {len(result.columns)} columns ({shown}), share "
                f"{result.share_drifted:.3f} >= {config.drift_share}"
            )
        if prediction is not None and prediction.drifted:
            figure = f"{prediction.method} {prediction.statistic:.4g}, threshold {prediction.threshold:.4g}"
            text = f"the champion's predictions drifted ({figure})"
            if config.prediction_drift_retrains:
                retrain = True
            reasons.append(text + ("" if config.prediction_drift_retrains else "; prediction_drift_retrains is off"))
    age = info.champion_age_days
    if config.max_champion_age_days is not None and age is not None and age > config.max_champion_age_days:
        retrain = True
        reasons.insert(
            0,
            f"champion version {info.model_version} is {age:.1f} days old (max_champion_age_days "
            f"{config.max_champion_age_days:g})",
        )
    if config.retrain_on == "always" and not retrain:
        retrain = True
        reasons.insert(0, "retrain_on is always: retrain whatever the figures")
    if not retrain:
        drifted = result.drifted_columns
        reasons.insert(
            0,
            f"no drift: {len(drifted)} of {len(result.columns)} columns drifted"
            f"{' (' + ', '.join(drifted[:8]) + ')' if drifted else ''}, share {result.share_drifted:.3f} < "
            f"{config.drift_share}",
        )
    return retrain, reasons


def drift_sample(df: Any, config: DetectDriftConfig, side: int) -> Any:
    from trainpipe.data.drift import sample

    return sample(df, min(config.sample_size, 20_000), config.seed + side)


__all__ = ["NAME", "detect_drift", "fetch_snapshot"]
