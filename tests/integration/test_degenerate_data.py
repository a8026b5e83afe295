"""Degenerate data, generated rather than listed (hypothesis): frames whose columns are empty,
constant, all null, of mixed types, infinite, or named in any script. validate_data (the real Great
Expectations) and training's preconditions (what every rank checks before it trains) either accept
a frame or refuse it in one line with a documented code, 2 (bad input) or 3 (the suite failed):
never an internal error (exit 1, a traceback), whatever the frame."""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

KINDS = ("numbers", "constant", "null", "mixed", "infinite", "text")
#: Column names in any script (no control characters or lone surrogates: CSV cannot hold them).
NAMES = st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=1, max_size=6)


def values(kind: str, rows: int, seed: int) -> list:
    """One column's values of a kind."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if kind == "numbers":
        return [float(v) for v in rng.normal(size=rows)]
    if kind == "constant":
        return [7] * rows
    if kind == "null":
        return [None] * rows
    if kind == "mixed":
        return [("x" if i % 3 == 0 else i) for i in range(rows)]
    if kind == "infinite":
        return [math.inf if i % 2 else -math.inf for i in range(rows)]
    return [f"t{i % 4}" for i in range(rows)]


@st.composite
def frames(draw: st.DrawFn) -> tuple[object, str]:
    """A frame of 0, 1, 3 or 100 rows: up to three features of any kind and a label of any kind, and the task."""
    import pandas as pd

    rows = draw(st.sampled_from([0, 1, 3, 100]))
    names = draw(st.lists(NAMES.filter(lambda n: n != "label"), min_size=1, max_size=3, unique=True))
    columns = {name: values(draw(st.sampled_from(KINDS)), rows, i) for i, name in enumerate(names)}
    label = draw(st.sampled_from(("classes", *KINDS)))
    columns["label"] = [i % 2 for i in range(rows)] if label == "classes" else values(label, rows, 99)
    return pd.DataFrame(columns), draw(st.sampled_from(["classification", "regression"]))


def _csv(frame: object, folder: str) -> Path:
    path = Path(folder) / "data.csv"
    frame.to_csv(path, index=False)  # type: ignore[attr-defined]
    return path


def _one_line(message: str) -> None:
    assert message and "\n" not in message.strip() and "Traceback" not in message, message


def _no_label_value() -> tuple[object, str]:
    """The case a user reported: a label column with no value in any row (it was exit 1, a traceback)."""
    import pandas as pd

    return pd.DataFrame({"a": [1.0, 2.0, 3.0], "label": [None, None, None]}), "classification"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(frames())
@example(_no_label_value())
def test_validate_data_accepts_or_refuses_any_frame_in_one_line(case):
    """The real suite on the generated frame, through the entrypoint as a container runs it."""
    from trainpipe.components.validate_data.core import validate_data
    from trainpipe.components.validate_data.spec import ValidateDataConfig
    from trainpipe.contract.entrypoint import run

    frame, task = case
    with tempfile.TemporaryDirectory() as tmp:
        data = _csv(frame, tmp)
        err = io.StringIO()
        argv = ["--data", str(data), "--output-dir", f"{tmp}/out", "--task", task, "--batch-size", "8"]
        with contextlib.redirect_stderr(err):
            code = run("validate_data", ValidateDataConfig, validate_data, argv)
        log = err.getvalue()
        assert code in (0, 2, 3), log[-3000:]
        assert "Traceback" not in log and "internal error" not in log, log[-3000:]
        if code:
            last = log.strip().splitlines()[-1]
            assert last.startswith("trainpipe validate_data: error: "), log[-3000:]
            assert not (Path(tmp) / "out" / "data.csv").exists()  # nothing handed on


@settings(max_examples=200, deadline=None, derandomize=True)
@given(frames())
def test_training_preconditions_accept_or_refuse_any_frame_in_one_line(case):
    """What every rank checks before it trains (the rows read, checked and split): a frame is
    trained on, or refused with an InputError of one line (exit 2)."""
    from trainpipe.contract.errors import EXIT_BAD_INPUT, InputError
    from trainpipe.training.data import load_table

    frame, task = case
    with tempfile.TemporaryDirectory() as tmp:
        data = _csv(frame, tmp)
        try:
            table = load_table(data, "label", task, 0.2, 0, 8)
        except InputError as exc:
            assert exc.exit_code == EXIT_BAD_INPUT
            _one_line(str(exc))
        else:
            assert len(table) >= 8 and table.x.dtype.kind == "f"
