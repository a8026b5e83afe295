"""``make lint``'s type check holds mypy's errors to scripts/mypy_baseline.json: a file over its count, or a new
file with errors, fails; a count that drops lowers the baseline. mypy itself is not run here (the lint runs it)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture
def baseline(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mypy_baseline", REPO / "scripts" / "mypy_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BASELINE", tmp_path / "baseline.json")
    module.BASELINE.write_text(json.dumps({"components/a/core.py": 2, "src/trainpipe/b.py": 1}))

    def found(counts):
        lines = {p: [f"{p}:1: error: x"] * n for p, n in counts.items()}
        monkeypatch.setattr(module, "run_mypy", lambda site: (Counter(counts), lines))

    return module, found


def test_an_error_path_as_installed_is_named_by_its_path_here(baseline):
    module, _ = baseline
    assert module.source_path("trainpipe/components/tune_model/study.py") == "components/tune_model/study.py"
    assert module.source_path("trainpipe/pipelines/config.py") == "pipelines/config.py"
    assert module.source_path("trainpipe/contract/io.py") == "src/trainpipe/contract/io.py"


@pytest.mark.parametrize(
    "counts",
    [{"components/a/core.py": 3, "src/trainpipe/b.py": 1}, {"components/a/core.py": 2, "src/trainpipe/new.py": 1}],
    ids=["a file over its count", "a new file with errors"],
)
def test_more_errors_fail_naming_the_file_and_keep_the_baseline(baseline, counts, capsys):
    module, found = baseline
    before = module.BASELINE.read_text()
    found(counts)
    assert module.main(["site"]) == 1
    grown = next(p for p in counts if counts[p] > json.loads(before).get(p, 0))
    assert f"{grown}: {counts[grown]} mypy errors" in capsys.readouterr().err
    assert module.BASELINE.read_text() == before


def test_fewer_errors_lower_the_baseline_and_a_clean_file_leaves_it(baseline):
    module, found = baseline
    found({"components/a/core.py": 1})
    assert module.main(["site"]) == 0
    assert json.loads(module.BASELINE.read_text()) == {"components/a/core.py": 1}
