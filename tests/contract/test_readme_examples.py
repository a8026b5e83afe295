"""What the docs' examples do not show by running (tests/docs runs each): the components' table, the links,
and the known defects' list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

#: The reference pages the README links to.
DOCS = sorted((REPO / "docs").glob("*.md"))

pytestmark = pytest.mark.contract


def _examples(document: Path) -> list:
    from sybil import Document

    from tests.docs.examples import parse

    return [region.parsed for _, region in Document.parse(str(document), parse).regions]


def test_every_known_defect_names_an_example():
    """A known defect's xfail goes with its fix: an entry that matches no example any more is stale."""
    from tests.docs.plugin import KNOWN_DEFECTS

    for doc, text in KNOWN_DEFECTS:
        assert any(text in block.source for block in _examples(REPO / doc)), f"{doc}: no example holds {text!r}"


def test_the_components_table_lists_trainpipe_components_in_their_order():
    """The README names the components from one list: its table is ``trainpipe.COMPONENTS``."""
    from trainpipe import COMPONENTS

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## The components", 1)[1].split("\n## ", 1)[0]
    assert tuple(re.findall(r"^\| `([a-z][a-z0-9_]*)` \| ", section, re.M)) == COMPONENTS
    for name in COMPONENTS:  # and each component's own README is linked from its row
        assert f"(components/{name}/README.md)" in section


def test_every_reference_page_is_linked_from_the_readme_and_every_link_resolves():
    """The README keeps the overview, the two commands and the components; the reference lives under docs/,
    each page linked from it. A relative link that names no file is a broken promise to the reader."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert DOCS and all(f"](docs/{page.name})" in readme for page in DOCS), [p.name for p in DOCS]
    for page in [REPO / "README.md", *DOCS, *sorted((REPO / "components").glob("*/README.md"))]:
        for target in re.findall(r"\]\((?!https?://|#|mailto:)([^)#]+)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which is not there"
