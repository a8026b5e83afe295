"""The whole suite's hooks: tests/ (the cross-component tiers) and each component's own tests/ folder.

Its folder is the repository root, so pytest puts the root on ``sys.path`` and a component's tests import
``tests.helpers`` as the tiers do.

The suite's time is a budget: the summary gives each tier's time, and names every test that took more than
:data:`SLOW_S` with the first line of its docstring, which says why it must be that slow (or that it says
nothing, which a reviewer sends back).
"""

import inspect

import pytest

TIERS = ("unit", "contract", "integration", "e2e", "cuda")
#: A test slower than this says in its docstring why it must be.
SLOW_S = 60.0
_tier_seconds: dict[str, float] = {}
_test_seconds: dict[str, float] = {}
_why: dict[str, str] = {}


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
    if _tier_seconds:
        shown = ", ".join(f"{t} {_tier_seconds[t]:.0f} s" for t in (*TIERS, "untiered") if t in _tier_seconds)
        terminalreporter.write_line(f"time by tier (setup, call and teardown): {shown}")
    slow = sorted(((s, n) for n, s in _test_seconds.items() if s > SLOW_S), reverse=True)
    if slow:
        terminalreporter.write_line(f"tests over {SLOW_S:.0f} s (setup, call and teardown), and why:")
        for seconds, nodeid in slow:
            why = _why.get(nodeid) or "(its docstring does not say why)"
            terminalreporter.write_line(f"  {seconds:6.0f} s  {nodeid}: {why[:240]}")
