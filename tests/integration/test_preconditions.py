"""validate_data's default suite is train_model's preconditions: data training would refuse stops at
validate_data, before anything is snapshotted, and both say the same thing (the column, and an
offending row or value). Both come from one list of rules (trainpipe.data.preconditions).

validate_data runs here in-process (real Great Expectations, imported once); train_model's side is
the check its data loader runs on every table it reads, and one case goes through the real
train_model entrypoint (torchrun, a rank) to show the rank says it in one line too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_component
from trainpipe.contract.errors import InputError, ValidationFailed

pytestmark = pytest.mark.integration


def _good(rows: int = 120) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3))
    return pd.DataFrame(x, columns=["f1", "f2", "f3"]).assign(label=(x[:, 0] > 0).astype(int))


def _text_in_feature(df):
    df["f2"] = df["f2"].astype(object)
    df.loc[7, "f2"] = "unknown"
    return df


def _na_in_feature(df):
    df["f2"] = df["f2"].astype(object)
    df.loc[7, "f2"] = "N/A"  # written to CSV and read back: pandas reads it as missing
    return df


def _null_label(df):
    df["label"] = df["label"].astype("Int64")
    df.loc[9, "label"] = pd.NA
    return df


def _huge(df):
    df.loc[11, "f3"] = 1e300
    return df


def _one_class(df):
    df["label"] = 1
    return df


#: case -> (how the good table is broken, the column both messages name, what else they name)
CASES = {
    "text in a feature": (_text_in_feature, "f2", "unknown"),
    "'N/A' in a feature": (_na_in_feature, "f2", "row 7"),
    "a missing label": (_null_label, "label", "row 9"),
    "no label column": (lambda df: df.drop(columns=["label"]), "label", "is not a column of the data"),
    "a value float32 cannot hold": (_huge, "f3", "row 11"),
    "one class": (_one_class, "label", "1"),
    "fewer rows than the split and a batch need": (lambda df: df.head(40), None, "rows"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_training_refuses_stops_at_validate_data_and_both_name_the_column(tmp_path, case):
    from trainpipe.components.validate_data.core import validate_data
    from trainpipe.components.validate_data.spec import ValidateDataConfig
    from trainpipe.contract.artifacts import begin_output
    from trainpipe.data.preconditions import check_frame, check_table
    from trainpipe.data.tabular import read_table

    breaker, column, detail = CASES[case]
    data = tmp_path / "data.csv"
    breaker(_good()).to_csv(data, index=False)
    settings = {"batch_size": 64, "test_fraction": 0.2, "seed": 0}
    begin_output(tmp_path / "v")  # as the entrypoint does
    with pytest.raises(ValidationFailed) as failed:
        validate_data(ValidateDataConfig(data=str(data), output_dir=str(tmp_path / "v"), **settings), {})
    suite_says = str(failed.value)
    assert not (tmp_path / "v" / "data.csv").exists(), "data that failed its suite was handed on"
    # what train_model checks on what it reads
    frame = read_table(data, "data")
    with pytest.raises(InputError) as refused:
        check_frame(frame, "label", "classification")
        check_table(frame, "label", "classification", **settings)
    training_says = str(refused.value)
    for says in (suite_says, training_says):
        if column:
            assert column in says, says
        assert detail in says, says
    assert len(suite_says.splitlines()) == len(training_says.splitlines()) == 1


def test_the_default_suite_is_the_rules_training_checks():
    from trainpipe.data.preconditions import column_rules, table_rules, training_suite

    suite = training_suite(["f1", "f2", "label"], "label", "classification", 64, 0.2, 0)
    rules = column_rules(["f1", "f2", "label"], "label", "classification") + table_rules(
        "label", "classification", 64, 0.2, 0
    )
    assert [e["meta"]["trainpipe_rule"] for e in suite["expectations"]] == [r.name for r in rules]
    assert [(e["type"], e["kwargs"]) for e in suite["expectations"]] == [(r.expectation_type, r.kwargs) for r in rules]


def test_a_rank_says_which_column_in_one_line(tmp_path):
    data = tmp_path / "data.csv"
    _text_in_feature(_good()).to_csv(data, index=False)
    proc = run_component(
        "train_model",
        "--data",
        str(data),
        "--output-dir",
        str(tmp_path / "m"),
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'm.db'}",
        "--nproc-per-node",
        "1",
        "--epochs",
        "1",
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last == "trainpipe train_model: error: data: feature column 'f2' is not numeric: row 7 holds 'unknown'", last
    assert not Path(tmp_path / "m" / "model.safetensors").exists()
