"""What the docs show is what the suite runs: every example block of README.md, docs/*.md and
components/*/README.md is a test, collected by Sybil and evaluated by :mod:`tests.docs.examples` in a scratch
folder of its document (:mod:`tests.docs.workspace`).

A plugin (the root conftest.py names it), so that its collection hook sees the documents at the root and in
docs/, which no conftest.py below the root would. Each example carries its tier's marker (``integration``:
it runs a command or a model; ``contract``: it compiles or loads), so ``-m`` selects examples as it selects
tests, and the summary ends with how many ran and how many are marked as not runnable here.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.integration.pytest import SybilItem

from tests.docs.examples import REPO, parse

#: Examples that fail today for a defect another branch fixes: xfail(strict=True), so each turns red (XPASS)
#: the day its fix lands, and its entry goes. (document, a text of the example) -> the defect, e.g.
#: ``("components/train_model/README.md", "--train-config '{\"lr\": 0.001}'"): "branch entries: KeyError 'width'"``.
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


class DocExamples(Sybil):
    """The documents whose examples are tests: README.md, docs/*.md and components/*/README.md."""

    def should_parse(self, path: Path) -> bool:
        try:
            parts = path.resolve().relative_to(REPO).parts
        except ValueError:
            return False
        return (
            parts == ("README.md",)
            or (len(parts) == 2 and parts[0] == "docs" and parts[1].endswith(".md"))
            or (len(parts) == 3 and parts[0] == "components" and parts[2] == "README.md")
        )


def _close(namespace: dict) -> None:
    namespace.pop("_scratch", None)


pytest_collect_file = DocExamples(parsers=[parse], fixtures=["doc_env"], teardown=_close).pytest()
_counts: Counter[str] = Counter()


@pytest.fixture(scope="session")
def doc_env(tmp_path_factory):
    """The docs' stand-in files and outputs (built once per session) and each document's scratch folder."""
    from tests.docs.workspace import DocEnv

    return DocEnv(tmp_path_factory)


def pytest_itemcollected(item):
    if not isinstance(item, SybilItem):
        return
    block = item.example.parsed
    item.add_marker(getattr(pytest.mark, block.tier))
    item.user_properties.append(("doc_example", "marked" if block.not_run else "ran"))
    for (doc, text), defect in KNOWN_DEFECTS.items():
        if block.doc == doc and text in block.source:
            item.add_marker(pytest.mark.xfail(strict=True, reason=defect))


def pytest_runtest_setup(item):
    """What the suite's list of slow tests shows for an example (the root conftest.py's "why"): the example."""
    if isinstance(item, SybilItem):
        block = item.example.parsed
        what = block.source.strip().splitlines()[0][:160]
        item.user_properties.append(("why", f"the docs' example at {block.doc}:{block.line}, as written: {what}"))


def pytest_runtest_logreport(report):
    """Counted where the reports arrive: on pytest-xdist's controller, each worker's too."""
    kind = dict(report.user_properties).get("doc_example")
    if kind and report.when == "call":
        _counts[kind] += 1


def pytest_terminal_summary(terminalreporter):
    if _counts and "PYTEST_XDIST_WORKER" not in os.environ:
        terminalreporter.write_line(
            f"doc examples: {_counts['ran']} ran, {_counts['marked']} marked (not run here, checked statically)"
        )
