"""The whole suite's hooks: tests/ (the cross-component tiers) and each component's own tests/ folder.

Its folder is the repository root, so pytest puts the root on ``sys.path`` and a component's tests import
``tests.helpers`` as the tiers do.

The suite's time is a budget: the summary gives each tier's time, and names every test that took more than
:data:`SLOW_S` with the first line of its docstring, which says why it must be that slow (or that it says
nothing, which a reviewer sends back).

The files run longest first (``tests/durations.json``: each file's seconds in a whole CI run on two cores,
where only the order counts), so the two pytest-xdist workers end together: xdist's own order, most tests
first, left the slowest files, which hold one or two tests each, for the end, and one worker ran them while
the other stood idle (about 3 minutes of CI's 45). ``make test`` passes ``--no-loadscope-reorder`` so that
xdist keeps this order. ``TRAINPIPE_RECORD_DURATIONS=tests/durations.json`` writes the file again from a run.
"""

import inspect
import json
import os
import sys
from pathlib import Path

import pytest


def _docs_plugin() -> tuple[str, ...]:
    """The docs' examples are tests too (tests/docs): a plugin, so that it collects README.md and docs/ at this
    level. It needs Sybil, a dev extra: a GPU machine with the package, torch and pytest alone runs ``tests/cuda``
    without it. Under CI (``CI=true``) it always loads, so a missing Sybil fails instead of skipping the docs."""
    if os.environ.get("CI") != "true":
        try:
            import sybil  # noqa: F401
        except ImportError:
            return ()
    return ("tests.docs.plugin",)


pytest_plugins = _docs_plugin()

TIERS = ("unit", "contract", "integration", "e2e", "cuda", "images")
#: A test slower than this says in its docstring why it must be.
SLOW_S = 60.0
_tier_seconds: dict[str, float] = {}
_test_seconds: dict[str, float] = {}
_why: dict[str, str] = {}
DURATIONS = Path(__file__).parent / "tests" / "durations.json"
#: Seconds a test of a file that ``durations.json`` does not know yet is expected to take, by tier.
GUESS_S = {"e2e": 60.0, "integration": 15.0, "contract": 1.0, "unit": 0.2, "cuda": 0.1, "images": 60.0}


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.fixture(autouse=True)
def _tracking_uri_stays_in_its_test():
    """``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in ``os.environ`` for subprocesses, so a
    test that calls it pointed every later entrypoint on its worker at its own server (seen once the file
    order changed: profile_training found no run on test_governance's server). Put back after each test."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if os.environ.get("MLFLOW_TRACKING_URI") != before:
        if "mlflow" in sys.modules:
            sys.modules["mlflow"].set_tracking_uri(before)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def pytest_collection_modifyitems(items):
    """The slowest files first (xdist's workers take files in this order), each file's tests in its own order."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    guessed: dict[str, float] = {}
    for item in items:
        tier = next((t for t in TIERS if t in item.keywords), "unit")
        guessed[_file_of(item.nodeid)] = guessed.get(_file_of(item.nodeid), 0.0) + GUESS_S[tier]
    position = {}
    for item in items:
        position.setdefault(_file_of(item.nodeid), len(position))
    order = {f: (-known.get(f, guessed[f]), position[f]) for f in position}
    items.sort(key=lambda item: order[_file_of(item.nodeid)])  # stable: a file's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The test's docstring travels with its reports (to the controller, under pytest-xdist)."""
    doc = inspect.getdoc(getattr(item, "function", None)) or ""
    item.user_properties.append(("why", " ".join(doc.split("\n\n")[0].split())))


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown time, added to its tier's (the suite's time is a budget)."""
    tier = next((t for t in TIERS if t in report.keywords), "untiered")
    _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + report.duration
    _test_seconds[report.nodeid] = _test_seconds.get(report.nodeid, 0.0) + report.duration
    why = dict(report.user_properties).get("why")
    if why is not None:
        _why[report.nodeid] = why


def pytest_terminal_summary(terminalreporter):
    record = os.environ.get("TRAINPIPE_RECORD_DURATIONS")
    if record and _test_seconds and "PYTEST_XDIST_WORKER" not in os.environ:
        per_file: dict[str, float] = {}
        for nodeid, seconds in _test_seconds.items():
            per_file[_file_of(nodeid)] = per_file.get(_file_of(nodeid), 0.0) + seconds
        ranked = dict(sorted(((f, round(s, 1)) for f, s in per_file.items()), key=lambda fs: -fs[1]))
        Path(record).write_text(json.dumps(ranked, indent=1) + "\n")
    if _tier_seconds:
        shown = ", ".join(f"{t} {_tier_seconds[t]:.0f} s" for t in (*TIERS, "untiered") if t in _tier_seconds)
        terminalreporter.write_line(f"time by tier (setup, call and teardown): {shown}")
    slow = sorted(((s, n) for n, s in _test_seconds.items() if s > SLOW_S), reverse=True)
    if slow:
        terminalreporter.write_line(f"tests over {SLOW_S:.0f} s (setup, call and teardown), and why:")
        for seconds, nodeid in slow:
            why = _why.get(nodeid) or "(its docstring does not say why)"
            terminalreporter.write_line(f"  {seconds:6.0f} s  {nodeid}: {why[:240]}")
