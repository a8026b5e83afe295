"""The bad-input corpus: inputs a user (or an attacker) can hand a component, each with the exit
code and the one line it must get. Files are written by :func:`materialize` from the text here,
so the corpus reads in one place and needs no binary fixtures.

Each case: ``(id, component, args, files, exit_code, needle)``. In ``args``, ``{d}`` is the case's
folder (its files and outputs), ``{model}`` a trained model artifact, ``{snap}`` a snapshot.
"""

from __future__ import annotations

import pickle
from pathlib import Path

GOOD_CSV = "f1,f2,label\n" + "".join(f"{i * 0.1:.1f},{(i % 7) * 0.3:.1f},{i % 2}\n" for i in range(40))


class Payload:
    """Unpickling this runs code: writes the file named at construction."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _pickle_payload(d: Path) -> bytes:
    return pickle.dumps({"model": Payload(str(d / "PWNED"))})


CASES: list[tuple[str, str, list[str], dict[str, object], int, str]] = [
    # --- data -------------------------------------------------------------------------------------
    (
        "malformed-csv",
        "validate_data",
        ["--data", "{d}/bad.csv", "--output-dir", "{d}/out"],
        {"bad.csv": 'f1,f2,label\n1,2,0\n3,"4,1\n5,6,7,8,9\n'},
        2,
        "data: ",
    ),
    (
        "not-parquet",
        "validate_data",
        ["--data", "{d}/bad.parquet", "--output-dir", "{d}/out"],
        {"bad.parquet": "this is not parquet\n"},
        2,
        "cannot be parsed as parquet",
    ),
    (
        "empty-file",
        "validate_data",
        ["--data", "{d}/empty.csv", "--output-dir", "{d}/out"],
        {"empty.csv": ""},
        2,
        "is empty",
    ),
    (
        "header-only",
        "validate_data",
        ["--data", "{d}/h.csv", "--output-dir", "{d}/out"],
        {"h.csv": "f1,f2,label\n"},
        2,
        "data: ",
    ),
    (
        "unsupported-format",
        "validate_data",
        ["--data", "{d}/d.xlsx", "--output-dir", "{d}/out"],
        {"d.xlsx": "x"},
        2,
        "is not a .csv or .parquet file",
    ),
    (
        "label-missing",
        "train_model",
        [
            "--data",
            "{d}/d.csv",
            "--output-dir",
            "{d}/out",
            "--label-column",
            "target",
            "--tracking-uri",
            "sqlite:///{d}/m.db",
        ],
        {"d.csv": GOOD_CSV},
        2,
        "label_column: 'target' is not a column",
    ),
    (
        "nan-label",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--tracking-uri", "sqlite:///{d}/m.db"],
        {"d.csv": GOOD_CSV.replace(",1\n", ",\n", 3)},
        2,
        "label_column: 'label' has 3 missing values (first at row 1)",
    ),
    (
        "wrong-dtype",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--tracking-uri", "sqlite:///{d}/m.db"],
        {"d.csv": GOOD_CSV.replace("0.1,", "abc,", 1)},
        2,
        "data: feature column 'f1' is not numeric: row 1 holds 'abc'",
    ),
    (
        "infinite-feature",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--tracking-uri", "sqlite:///{d}/m.db"],
        {"d.csv": GOOD_CSV.replace("0.2,", "inf,", 1)},
        2,
        "data: feature column 'f1' holds a value outside float32's range: row 2 holds inf",
    ),
    (
        "unseen-label",
        "evaluate_model",
        ["--model", "{model}", "--data", "{d}/d.csv", "--output-dir", "{d}/out", "--label-column", "target"],
        {"d.csv": "f1,f2,f3,f4,target\n" + "0.1,0.2,0.3,0.4,maybe\n" * 30},
        2,
        "maybe",
    ),
    (
        "drift-schemas-differ",
        "detect_drift",
        ["--data", "{d}/cur.csv", "--reference", "{d}/ref.csv", "--output-dir", "{d}/out"],
        {"ref.csv": GOOD_CSV, "cur.csv": GOOD_CSV.replace("f2,", "f9,", 1)},
        2,
        "current: has no column 'f2' (the schemas differ)",
    ),
    (
        "drift-empty-current",
        "detect_drift",
        ["--data", "{d}/cur.csv", "--reference", "{d}/ref.csv", "--output-dir", "{d}/out"],
        {"ref.csv": GOOD_CSV, "cur.csv": "f1,f2,label\n"},
        2,
        "data: ",
    ),
    (
        "drift-type-changed",
        "detect_drift",
        ["--data", "{d}/cur.csv", "--reference", "{d}/ref.csv", "--output-dir", "{d}/out"],
        {"ref.csv": GOOD_CSV, "cur.csv": GOOD_CSV.replace("0.1,", "abc,", 1)},
        2,
        "current: column 'f1' is categorical but numeric in the reference",
    ),
    (
        "drift-no-reference",
        "detect_drift",
        ["--data", "{d}/cur.csv", "--output-dir", "{d}/out"],
        {"cur.csv": GOOD_CSV},
        2,
        "reference: give the reference data, or model_name",
    ),
    (
        "drift-unknown-method",
        "detect_drift",
        ["--config", "{d}/c.yaml", "--data", "{d}/cur.csv", "--reference", "{d}/cur.csv", "--output-dir", "{d}/out"],
        {"cur.csv": GOOD_CSV, "c.yaml": "column_methods:\n  f1: median\n"},
        2,
        "'median' is not one of ks, wasserstein, psi, chisquare, jensenshannon",
    ),
    # --- config -----------------------------------------------------------------------------------
    (
        "huge-epochs",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--epochs", "10000000"],
        {"d.csv": GOOD_CSV},
        2,
        "train_model field 'epochs': Input should be less than or equal to",
    ),
    (
        "negative-batch",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--batch-size", "-8"],
        {"d.csv": GOOD_CSV},
        2,
        "train_model field 'batch_size': Input should be greater than or equal to 1",
    ),
    (
        "unknown-key-in-file",
        "validate_data",
        ["--config", "{d}/c.yaml", "--data", "{d}/d.csv", "--output-dir", "{d}/out"],
        {"c.yaml": "label_column: label\nlabel_colum: typo\n", "d.csv": GOOD_CSV},
        2,
        "validate_data field 'label_colum': unknown key",
    ),
    (
        "config-not-a-mapping",
        "validate_data",
        ["--config", "{d}/c.yaml", "--data", "{d}/d.csv", "--output-dir", "{d}/out"],
        {"c.yaml": "- a\n- b\n", "d.csv": GOOD_CSV},
        2,
        "must hold a mapping of settings",
    ),
    # --- paths and URIs ---------------------------------------------------------------------------
    (
        "output-traversal",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out/../../escaped"],
        {"d.csv": GOOD_CSV},
        2,
        "output_dir: '{d}/out/../../escaped' climbs out with '..'",
    ),
    (
        "input-artifact-traversal",
        "train_model",
        ["--data", "{snap}/x/..", "--output-dir", "{d}/out"],
        {"d.csv": GOOD_CSV},
        2,
        "climbs out with '..'",
    ),
    (  # a new user's `--data ../nope.csv` was told it climbs out, while `../churn.csv` was read
        "missing-input-with-dotdot",
        "validate_data",
        ["--data", "{d}/../nope.csv", "--output-dir", "{d}/out"],
        {"d.csv": GOOD_CSV},
        2,
        "data: '{d}/../nope.csv' does not exist",
    ),
    (
        "outside-workspace",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "/tmp/trainpipe-elsewhere/out"],
        {"d.csv": GOOD_CSV},
        2,
        "output_dir: '/tmp/trainpipe-elsewhere/out' is outside the workspace",
    ),
    (
        "uri-output",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "s3://bucket/out"],
        {"d.csv": GOOD_CSV},
        2,
        "output_dir: unsupported URI scheme 's3://'",
    ),
    (
        "uri-data",
        "validate_data",
        ["--data", "ftp://example.com/d.csv", "--output-dir", "{d}/out"],
        {},
        2,
        "data: unsupported URI scheme 'ftp://'",
    ),
    (
        "repo-dir-of-someone-else",
        "snapshot_dataset",
        ["--data", "{snap}", "--output-dir", "{d}/out", "--repo-dir", "{d}/notes", "--remote-url", "{d}/remote"],
        {"notes/mine.txt": "not a git repository"},
        2,
        "repo_dir: '{d}/notes' exists, is not a git repository and holds files (mine.txt)",
    ),
    (
        "remote-scheme",
        "snapshot_dataset",
        ["--data", "{snap}", "--output-dir", "{d}/out", "--repo-dir", "{d}/repo", "--remote-url", "gopher://x/y"],
        {},
        2,
        "remote_url: unsupported URI scheme 'gopher://'",
    ),
    (
        "tracking-scheme",
        "train_model",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--tracking-uri", "ftp://mlflow", "--batch-size", "8"],
        {"d.csv": GOOD_CSV},
        2,
        "tracking_uri: unsupported scheme",
    ),
    (
        "tracking-plain-http",
        "train_model",
        [
            "--data",
            "{d}/d.csv",
            "--output-dir",
            "{d}/out",
            "--tracking-uri",
            "http://mlflow.example.com",
            "--batch-size",
            "8",
        ],
        {"d.csv": GOOD_CSV},
        2,
        "tracking_uri: plain http:// to 'mlflow.example.com' is refused",
    ),
    # --- suites -----------------------------------------------------------------------------------
    (
        "suite-not-json",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--suite", "{d}/s.json"],
        {"d.csv": GOOD_CSV, "s.json": "{nope"},
        2,
        "suite",
    ),
    (
        "suite-unknown-expectation",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--suite", "{d}/s.json"],
        {"d.csv": GOOD_CSV, "s.json": '{"name": "s", "expectations": [{"type": "expect_the_moon", "kwargs": {}}]}'},
        2,
        "expect_the_moon",
    ),
    (
        "suite-unknown-builtin",
        "validate_data",
        ["--data", "{d}/d.csv", "--output-dir", "{d}/out", "--suite", "builtin:nope"],
        {"d.csv": GOOD_CSV},
        2,
        "unknown built-in suite",
    ),
    # --- artifacts that are not ours --------------------------------------------------------------
    (
        "pickle-as-weights",
        "evaluate_model",
        ["--model", "{d}/model", "--data", "{snap}", "--output-dir", "{d}/out", "--label-column", "target"],
        {"model/model.safetensors": _pickle_payload},
        2,
        "cannot be loaded",
    ),
    (
        "foreign-model-code",
        "evaluate_model",
        ["--model", "{d}/model", "--data", "{snap}", "--output-dir", "{d}/out", "--label-column", "target"],
        {"model/model.json": "BUILDER:os:system"},
        2,
        "not trusted here",
    ),
    (
        "pickle-checkpoint",
        "train_model",
        [
            "--data",
            "{snap}",
            "--output-dir",
            "{d}/out",
            "--label-column",
            "target",
            "--tracking-uri",
            "sqlite:///{d}/m.db",
            "--nproc-per-node",
            "1",
            "--epochs",
            "1",
        ],
        # a foreign checkpoint folder whose DCP metadata is a pickle payload: its metadata is read with an
        # unpickler that admits DCP's own classes only, so it is skipped as unreadable and training starts afresh: exit
        # 0
        {
            "out/checkpoints/ckpt-0000000099/.metadata": _pickle_payload,
            "out/checkpoints/ckpt-0000000099/trainer.json": '{"global_step": 99, "batches_done": 99, "history": []}',
        },
        0,
        "skipping unreadable checkpoint ckpt-0000000099",
    ),
]
