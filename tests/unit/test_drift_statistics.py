"""trainpipe.data.drift on bundled data: what moved is named per column, what did not stays quiet."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits, load_wine

from trainpipe.contract.errors import InputError
from trainpipe.data.drift import compare

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def digits() -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = load_digits(as_frame=True).frame.rename(columns={"target": "label"})
    order = np.random.default_rng(0).permutation(len(frame))
    return frame.iloc[order[:900]], frame.iloc[order[900:]]


@pytest.fixture(scope="module")
def wine() -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = load_wine(as_frame=True).frame.rename(columns={"target": "label"})
    frame["region"] = np.where(frame["alcohol"] > 13, "north", "south")
    order = np.random.default_rng(0).permutation(len(frame))
    return frame.iloc[order[:89]], frame.iloc[order[89:]].copy()


def test_an_unchanged_resample_does_not_drift(digits, wine):
    for ref, cur in (digits, wine):
        result = compare(ref, cur, label="label")
        assert result.drifted_columns == [] and not result.dataset_drift
        assert {c.method for c in result.columns} <= {"ks", "chisquare"}  # small samples: the tests decide


def test_a_shifted_and_a_scaled_feature_are_named(digits):
    ref, cur = digits
    moved = cur.assign(pixel_2_3=cur["pixel_2_3"] + 4, pixel_3_3=cur["pixel_3_3"] * 1.8)
    result = compare(ref, moved, label="label")
    assert result.drifted_columns == ["pixel_2_3", "pixel_3_3"]
    assert not result.dataset_drift  # 2 of 65 columns: under the default share of 0.5
    assert compare(ref, moved, label="label", drift_share=0.03).dataset_drift


def test_a_new_category_and_a_changed_label_balance_are_named(digits, wine):
    ref, cur = wine
    cur.loc[cur.index[:30], "region"] = "east"
    assert compare(ref, cur, label="label").drifted_columns == ["region"]
    ref, cur = digits
    label = [c for c in compare(ref, cur[cur["label"] < 3], label="label").columns if c.is_label][0]
    assert label.drifted and label.kind == "categorical" and label.method == "chisquare"


def test_large_samples_use_the_distances_sampled_with_a_stated_seed():
    rng = np.random.default_rng(1)
    ref = pd.DataFrame(rng.normal(size=(30_000, 3)), columns=["a", "b", "c"]).assign(k=rng.choice(["x", "y"], 30_000))
    cur = ref.assign(b=ref["b"] * 1.5)
    one = compare(ref, cur, sample_size=5_000, seed=7)
    assert one.sampled and one.drifted_columns == ["b"]
    assert {c.column: c.method for c in one.columns} == {
        "a": "wasserstein",
        "b": "wasserstein",
        "c": "wasserstein",
        "k": "jensenshannon",
    }
    assert all(c.reference_rows == 5_000 for c in one.columns)
    assert one.to_dict() == compare(ref, cur, sample_size=5_000, seed=7).to_dict()  # reproducible
    psi = compare(ref, cur, methods={"b": "psi"}, thresholds={"a": 0.5})
    assert [c.method for c in psi.columns if c.column == "b"] == ["psi"] and psi.drifted_columns == ["b"]


@pytest.mark.parametrize(
    ("ref_cols", "cur", "message"),
    [
        (["a", "b"], pd.DataFrame({"a": [1.0]}), "current: has no column 'b' (the schemas differ)"),
        (["a"], pd.DataFrame({"a": [1.0], "z": [2.0]}), "current: column 'z' is not in the reference"),
        (["a"], pd.DataFrame({"a": ["x"]}), "current: column 'a' is categorical but numeric in the reference"),
        (["a"], pd.DataFrame({"a": []}, dtype=float), "current: has no rows to compare"),
    ],
)
def test_bad_input_is_one_line_naming_the_column(ref_cols, cur, message):
    ref = pd.DataFrame({c: [1.0, 2.0, 3.0] for c in ref_cols})
    with pytest.raises(InputError) as err:
        compare(ref, cur)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InputError, match="methods.a: 'median' is not one of"):
        compare(ref, ref, methods={"a": "median"})
    with pytest.raises(InputError, match="methods.a: chisquare compares categorical columns"):
        compare(ref, ref, methods={"a": "chisquare"})


def test_the_component_decides_and_writes_its_result_and_report(tmp_path, digits):
    """detect_drift's core on an explicit reference: the decision, its reasons, what it writes."""
    import json

    from trainpipe.components.detect_drift.core import detect_drift
    from trainpipe.components.detect_drift.spec import DetectDriftConfig
    from trainpipe.contract.lineage import Lineage

    ref, cur = digits
    ref.to_csv(tmp_path / "ref.csv", index=False)
    cur.assign(pixel_2_3=cur["pixel_2_3"] + 4).to_csv(tmp_path / "cur.csv", index=False)
    base = {"data": str(tmp_path / "cur.csv"), "reference": str(tmp_path / "ref.csv")}
    held = detect_drift(DetectDriftConfig(**base, output_dir=str(tmp_path / "a")), Lineage())
    assert held.retrain is False and held.drifted_columns == ["pixel_2_3"] and held.reference.source == "explicit"
    assert held.reasons == ["no drift: 1 of 65 columns drifted (pixel_2_3), share 0.015 < 0.5"]
    assert held.lineage.drift.retrain is False and held.lineage.drift.drifted_columns == ["pixel_2_3"]
    always = detect_drift(DetectDriftConfig(**base, output_dir=str(tmp_path / "b"), retrain_on="always"), Lineage())
    assert always.retrain is True and always.reasons[0] == "retrain_on is always: retrain whatever the figures"
    assert always.drifted_columns == ["pixel_2_3"]  # still measured
    share = detect_drift(DetectDriftConfig(**base, output_dir=str(tmp_path / "c"), drift_share=0.01), Lineage())
    assert share.retrain is True and share.reasons[0].startswith(
        "data drifted: 1 of 65 columns (pixel_2_3), share 0.015 >= 0.01"
    )
    written = json.loads((tmp_path / "c" / "drift.json").read_text())
    assert written["retrain"] is True and len(written["columns"]) == 65
    assert "<h1>Drift: retrain</h1>" in (tmp_path / "c" / "report.html").read_text()
    assert [s[0] for s in share.series()[:3]] == [
        "trainpipe_drift_dataset_drift",
        "trainpipe_drift_share",
        "trainpipe_drift_retrain",
    ]
    # the new snapshot may be a folder of Parquet files
    folder = tmp_path / "cur-parquet"
    folder.mkdir()
    moved = cur.assign(pixel_2_3=cur["pixel_2_3"] + 4)
    moved.iloc[:400].to_parquet(folder / "part-0.parquet")
    moved.iloc[400:].to_parquet(folder / "part-1.parquet")
    parts = detect_drift(
        DetectDriftConfig(data=str(folder), reference=str(tmp_path / "ref.csv"), output_dir=str(tmp_path / "d")),
        Lineage(),
    )
    assert parts.current_rows == len(cur) and parts.drifted_columns == ["pixel_2_3"]


def test_a_lineage_that_names_no_complete_snapshot_is_one_line(tmp_path):
    from trainpipe.components.detect_drift.core import fetch_snapshot

    with pytest.raises(InputError) as err:
        fetch_snapshot({"md5": "abc", "path": "data/digits.csv"}, tmp_path)
    assert (
        str(err.value)
        == "model_name: the champion's lineage has no complete DVC snapshot record (no rev, repo, remote); give "
        "reference"
    )
    with pytest.raises(InputError, match=r"model_name: snapshot data/x.csv@0000000000 is not in .* at that revision"):
        fetch_snapshot(
            {
                "md5": "a",
                "rev": "0" * 40,
                "path": "data/x.csv",
                "repo": str(tmp_path / "no-repo"),
                "remote": str(tmp_path),
            },
            tmp_path,
        )
