"""Data Docs of a suite checked without GX (:mod:`checks`): the same folder, index and one page a file that
GX's site has, drawn from the same validation result, in the standard library. GX's site builder is GX's
whole import (seconds); these pages cost milliseconds. A suite run on GX gets GX's own site."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from trainpipe.contract.io import atomic_write_text

_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;width:100%}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}"
    ".ok{color:#1a7f37}.bad{color:#c62828;font-weight:bold}code{font-size:12px}"
)


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def _cell(r: dict[str, Any], reason: str | None) -> str:
    res = r.get("result") or {}
    exc = r.get("exception_info") or {}
    parts = []
    if reason:
        parts.append(html.escape(reason))
    if exc.get("raised_exception"):
        parts.append("raised: " + html.escape(str(exc.get("exception_message"))))
    if "observed_value" in res:
        parts.append(f"observed: {html.escape(json.dumps(res['observed_value'], default=str))}")
    if res.get("unexpected_count"):
        shown = json.dumps(res.get("partial_unexpected_list", [])[:10], default=str)
        rows = res.get("partial_unexpected_index_list")
        parts.append(
            f"{res['unexpected_count']} unexpected of {res.get('element_count')}: {html.escape(shown)}"
            + (f" at rows {html.escape(json.dumps(rows[:10], default=str))}" if rows else "")
        )
    if res.get("missing_count"):
        parts.append(f"{res['missing_count']} missing (not checked)")
    return "<br>".join(parts)


def page(validation: dict[str, Any], data_name: str, reasons: dict[int, str]) -> str:
    """One validation's page: the suite, the data, and each expectation's outcome and evidence."""
    stats = validation["statistics"]
    rows = []
    for i, r in enumerate(validation["results"]):
        cfg = r["expectation_config"]
        kwargs = ", ".join(f"{k}={v}" for k, v in cfg.get("kwargs", {}).items() if k != "batch_id")
        mark = '<span class="ok">passed</span>' if r["success"] else '<span class="bad">failed</span>'
        rows.append(
            f"<tr><td>{mark}</td><td><code>{html.escape(cfg['type'])}({html.escape(kwargs)})</code></td>"
            f"<td>{_cell(r, reasons.get(i))}</td></tr>"
        )
    verdict = "passed" if validation["success"] else "failed"
    body = (
        f"<h1>Validation of {html.escape(data_name)}: {verdict}</h1>"
        f"<p>suite <b>{html.escape(validation['suite_name'])}</b>: {stats['successful_expectations']} of "
        f"{stats['evaluated_expectations']} expectations held. "
        f"Checked by {html.escape(str(validation.get('meta', {}).get('checked_by', '')))}.</p>"
        "<table><tr><th>outcome</th><th>expectation</th><th>evidence</th></tr>" + "".join(rows) + "</table>"
    )
    return _page(f"{validation['suite_name']}: {data_name}", body)


def write_site(
    root: Path, validations: list[dict[str, Any]], names: list[str], reasons: list[dict[int, str]]
) -> list[Path]:
    """``root/index.html`` and ``root/validations/<suite>/<data file>.html``, one page per file validated.

    Returns:
        The pages, in the order of ``validations``.
    """
    pages = []
    links = []
    for validation, name, why in zip(validations, names, reasons, strict=True):
        rel = Path("validations") / validation["suite_name"] / f"{Path(name).stem}.html"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / rel, page(validation, name, why), durable=False)
        pages.append(root / rel)
        verdict = "passed" if validation["success"] else "failed"
        links.append(f'<li><a href="{html.escape(rel.as_posix())}">{html.escape(name)}</a>: {verdict}</li>')
    suite = validations[0]["suite_name"] if validations else ""
    atomic_write_text(
        root / "index.html",
        _page(f"Data Docs: {suite}", f"<h1>Data Docs: suite {html.escape(suite)}</h1><ul>{''.join(links)}</ul>"),
        durable=False,
    )
    return pages
