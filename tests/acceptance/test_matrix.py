"""The acceptance matrix (:mod:`tests.acceptance.matrix`), one test per checked cell.

Each entry is taken once per session, dry (every step writes what it received and stops), from what a team
writes: its own package, data, Feast repository, priced profile file, pipeline config, KFP pipeline and DAG
file (``conftest.py``). A cell fails naming the entry, the step and what it received instead. A dry run
narrows a test, it does not replace one: each engine also runs the team's training once per session for
real, its function recording what it received, and a cell that reads what the training step received fails
where its dry record and that receipt differ; a real study of the tune section (its baseline and one sampled
trial) holds the cells that read what a trial trains the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.acceptance.matrix import (
    CELLS,
    ENTRIES,
    FEATURES,
    NA,
    READ_RECEIVED,
    TRIALS,
    RunFor,
    as_received,
    dry_configs,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

#: Cells that fail on ea00aeb, each until its defect's fix lands (strict: a cell that passes must leave this list).
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}

CHECKED = [
    pytest.param(f, e, id=f"{f}@{e}", marks=[pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[f, e])])
    if (f, e) in KNOWN_DEFECTS
    else pytest.param(f, e, id=f"{f}@{e}")
    for (f, e), cell in CELLS.items()
    if callable(cell)
]


@pytest.mark.parametrize(("feature", "entry"), CHECKED)
def test_cell(feature, entry, entries, received, scenario):
    """One cell: what the steps received on this entry, from what the team wrote (dry runs, shared per entry);
    a cell that reads what the training step received, on an entry with a real run (one per engine and session,
    shared), also holds its dry record to what the team's function received there; one that reads what
    tune_model's trials train holds it to what a real study's trials received (one per session, shared)."""
    check = CELLS[feature, entry]
    records = entries(entry)
    check(records, scenario, entry)
    for which in READ_RECEIVED.get(check, ()):
        real = received("tune-trial" if which in TRIALS else entry)
        if real is not None:
            for dry in dry_configs(records, which):
                as_received(dry, real.of(which), f"{entry}: {which}")


@pytest.mark.unit
def test_every_cell_is_declared():
    """Every feature has a cell on every entry: a check, a test that runs it for real, or why it cannot apply."""
    missing = [(f, e) for f in FEATURES for e in ENTRIES if (f, e) not in CELLS]
    assert not missing, f"cells without a declaration: {missing}"
    unknown = [key for key in CELLS if key[0] not in FEATURES or key[1] not in ENTRIES]
    assert not unknown, f"cells of no feature or entry: {unknown}"
    for key, cell in CELLS.items():
        if isinstance(cell, NA):
            assert len(cell.why) > 20, f"{key}: say why it does not apply"


@pytest.mark.unit
def test_the_tests_that_run_cells_for_real_exist():
    """A cell run elsewhere names a test that exists, so a rename cannot leave the cell unproven."""
    for key, cell in CELLS.items():
        if isinstance(cell, RunFor):
            path, _, name = cell.test.partition("::")
            source = REPO / path
            assert source.is_file(), f"{key}: {path} does not exist"
            assert not name or re.search(rf"^def {name}\(", source.read_text(), re.M), f"{key}: no {cell.test}"
