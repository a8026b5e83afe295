"""Open an HTML report in headless Chromium (Debian's package, driven by Playwright) and
return what a person would see: images with their rendered size, console errors, text."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = os.environ.get("TRAINPIPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("chromium is required under CI (make browser installs Debian's package)")
        pytest.skip("chromium is not installed (make browser)")
    return path


def render(report: Path, script: str | None = None) -> dict:
    """What a person sees; ``script`` (a JS expression) is evaluated on the loaded page, its value under ``value``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.resolve().as_uri())
            page.wait_for_load_state("load")
            images = page.evaluate(
                "[...document.images].map(i => ({alt: i.alt, width: i.naturalWidth, height: i.naturalHeight}))"
            )
            value = page.evaluate(script) if script else None
            return {
                "images": images,
                "errors": errors,
                "text": page.inner_text("body"),
                "title": page.title(),
                "value": value,
            }
        finally:
            browser.close()
