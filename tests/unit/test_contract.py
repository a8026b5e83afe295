"""The shared contract: one-line config errors, atomic writes, lineage, exit codes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_component
from trainpipe.components.train_model.spec import TrainModelConfig
from trainpipe.components.validate_data.spec import ValidateDataConfig
from trainpipe.contract import artifacts, errors, lineage
from trainpipe.contract.config import build, load_file
from trainpipe.contract.io import atomic_write_json, file_digest
from trainpipe.data.tabular import split_indices

pytestmark = pytest.mark.unit


def test_unknown_key_is_rejected_in_one_line():
    with pytest.raises(errors.InputError) as e:
        build(ValidateDataConfig, {"data": "x.csv", "output_dir": "o", "lable_column": "y"}, where="validate_data")
    msg = str(e.value)
    assert "\n" not in msg
    assert "'lable_column'" in msg and "unknown key" in msg


def test_bad_values_name_the_field():
    with pytest.raises(errors.InputError) as e:
        build(TrainModelConfig, {"data": "d", "output_dir": "o", "nproc_per_node": 0, "epochs": -1})
    msg = str(e.value)
    assert "'nproc_per_node'" in msg and "'epochs'" in msg and "\n" not in msg


def test_batch_not_divisible_by_ranks():
    with pytest.raises(errors.InputError, match="divisible"):
        build(TrainModelConfig, {"data": "d", "output_dir": "o", "nproc_per_node": 3, "batch_size": 64})


def test_config_file_errors(tmp_path):
    with pytest.raises(errors.InputError, match="does not exist"):
        load_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(errors.InputError, match="not valid YAML"):
        load_file(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(errors.InputError, match="mapping"):
        load_file(lst)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"b": 1, "a": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"a": 2, "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_incomplete_artifact_is_refused(tmp_path):
    out = artifacts.begin_output(tmp_path / "out")
    (out / "data.csv").write_text("a\n1\n")
    with pytest.raises(errors.InputError, match="not a completed trainpipe artifact"):
        artifacts.read_artifact(out, "data")
    artifacts.finish_output(out, "x", {"ok": True}, {"source": {"md5": "1"}})
    ref = artifacts.read_artifact(out, "data")
    assert ref.component == "x" and ref.lineage == {"source": {"md5": "1"}}
    artifacts.begin_output(out)  # a rerun starting over un-completes it
    with pytest.raises(errors.InputError):
        artifacts.read_artifact(out, "data")


def test_an_output_folder_this_process_cannot_write_is_refused_before_the_step(tmp_path):
    """A mounted folder the container's user cannot write (here /sys, which even root may not write) is a bad
    input named in one line, exit 2, found before any work: not a traceback mid-step, exit 1 (a new user's find)."""
    import subprocess
    import sys

    data = tmp_path / "d.csv"
    data.write_text("a,label\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    cmd = [sys.executable, "-m", "trainpipe.components.validate_data", "--data", str(data)]
    proc = subprocess.run(
        [*cmd, "--output-dir", "/sys/tp-out"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert "output_dir: '/sys/tp-out' cannot be written by this process" in line and "Traceback" not in proc.stderr


SNAPSHOT = {"md5": "1", "rev": "abc", "path": "data/d/d.csv", "remote": "/remote", "repo": "/repo"}


def test_lineage_merge_and_conflict():
    a = {"snapshot": SNAPSHOT, "steps": ["validate_data"]}
    b = {"snapshot": SNAPSHOT, "team_step": {"rows": 3}, "steps": ["train_model"]}
    merged = lineage.merge([a, b])
    assert merged.snapshot.md5 == "1" and merged.steps == ["validate_data", "train_model"]
    assert merged.to_dict()["team_step"] == {"rows": 3}  # a team's own component adds a section of its own
    assert "training" not in merged.to_dict()  # sections not reached yet are absent, not null
    with pytest.raises(errors.InputError, match="conflicting lineage"):
        lineage.merge([a, {"snapshot": {**SNAPSHOT, "md5": "2"}}])
    flat = lineage.flatten(lineage.Lineage.of({"snapshot": SNAPSHOT, "steps": ["a", "b"]}))
    assert flat["lineage.snapshot.md5"] == "1" and flat["lineage.steps"] == "a,b"


def test_a_lineage_section_that_is_not_trainpipes_is_refused_in_one_line():
    with pytest.raises(
        errors.InputError, match=r"lineage: section 'snapshot.rev' is not what trainpipe writes \(Field required\)"
    ):
        lineage.Lineage.of({"snapshot": {"md5": "1"}})
    with pytest.raises(errors.InputError, match="lineage: section 'source.rows' is not what trainpipe writes"):
        lineage.Lineage.of({"source": {"uri": "/d.csv", "md5": "1", "rows": "many", "columns": 3}})


def test_exit_code_classes():
    assert errors.InputError.exit_code == 2 and not errors.InputError.retryable
    assert errors.ValidationFailed.exit_code == 3
    assert errors.ServiceUnavailable.exit_code == 75 and errors.ServiceUnavailable.retryable
    assert errors.is_retryable_exit(75) and errors.is_retryable_exit(-9) and errors.is_retryable_exit(137)
    assert not errors.is_retryable_exit(2) and not errors.is_retryable_exit(3)


def test_split_is_deterministic_disjoint_and_the_same_in_any_chunking():
    import numpy as np

    from trainpipe.data.tabular import held_out, min_rows

    tr1, te1 = split_indices(10_000, 0.2, 7)
    tr2, te2 = split_indices(10_000, 0.2, 7)
    assert (tr1 == tr2).all() and (te1 == te2).all()
    assert not set(tr1) & set(te1) and len(tr1) + len(te1) == 10_000
    assert 1850 <= len(te1) <= 2150  # a row's fate is a hash: the share is the fraction, within sampling noise
    _, te3 = split_indices(10_000, 0.2, 8)
    assert set(te3) != set(te1)
    # a row's fate depends on its number alone: read in chunks (Parquet row groups), the split is the same
    rows = np.arange(10_000)
    chunked = np.concatenate([held_out(rows[i : i + 777], 0.2, 7) for i in range(0, 10_000, 777)])
    assert np.array_equal(np.flatnonzero(chunked), te1)
    # the fewest rows that give a batch of training rows and a held-out row, exactly
    need = min_rows(64, 0.2, 7)
    train, test = split_indices(need, 0.2, 7)
    assert len(train) >= 64 and len(test) >= 1
    tr, te = split_indices(need - 1, 0.2, 7)
    assert len(tr) < 64 or len(te) < 1


def test_file_digest_is_md5_by_default(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    assert file_digest(p) == "900150983cd24fb0d6963f7d28e17f72"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--output-dir", "OUT"], "'data': Field required"),
        (["--data", "missing.csv", "--output-dir", "OUT"], "does not exist"),
        (["--data", "DATA", "--output-dir", "OUT", "--colour", "x"], "unrecognized arguments"),
        (["--data", "DATA", "--output-dir", "OUT", "--suite", "builtin:nope"], "unknown built-in suite"),
    ],
)
def test_entrypoint_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, tiny_csv, args, needle):
    out = tmp_path / "out"
    args = [a.replace("OUT", str(out)).replace("DATA", str(tiny_csv)) for a in args]
    proc = run_component("validate_data", *args)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()  # one line: argparse's usage too is left to --help
    assert needle in line and line.startswith("trainpipe validate_data: error: ")
    assert proc.stdout == ""
    assert not (out / artifacts.MARKER).exists()
