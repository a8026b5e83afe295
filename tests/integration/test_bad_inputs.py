"""Every case of the bad-input corpus (tests/corpus/bad_inputs.py) against the real entrypoint:
one line naming the problem, the documented permanent exit code, no traceback, nothing
half-written, and no foreign code run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component
from tests.corpus.bad_inputs import CASES
from trainpipe.contract.artifacts import MARKER

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, tiny_csv):
    root = tmp_path_factory.mktemp("corpus")
    make_snapshot(root, tiny_csv)
    result_of(
        run_component(
            "train_model",
            "--data",
            str(root / "s"),
            "--output-dir",
            str(root / "m"),
            "--label-column",
            "target",
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--nproc-per-node",
            "1",
            "--epochs",
            "1",
        )
    )
    return {"model": root / "m", "snap": root / "s"}


def materialize(d: Path, files: dict, art: dict) -> None:
    for rel, content in files.items():
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.startswith("model/") and not (d / "model").joinpath("trainpipe.json").exists():
            shutil.copytree(art["model"], d / "model", dirs_exist_ok=True)
        if callable(content):
            path.write_bytes(content(d))
        elif isinstance(content, str) and content.startswith("BUILDER:"):
            meta = json.loads(path.read_text())
            meta["builder"] = content[len("BUILDER:") :]
            path.write_text(json.dumps(meta))
        else:
            path.write_text(content)


#: One case per component runs as a process, as a container runs it (its exit status, its stderr, what it leaves);
#: the others are the same entrypoint called in this process.
IN_A_PROCESS = {next(c[0] for c in CASES if c[1] == component) for component in {c[1] for c in CASES}}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, artifacts, case, monkeypatch):
    name, component, args, files, code, needle = case
    d = tmp_path / "case"
    d.mkdir()
    materialize(d, files, artifacts)
    fill = {"d": str(d), "model": str(artifacts["model"]), "snap": str(artifacts["snap"])}
    args = [a.format(**fill) for a in args]
    env = {"TRAINPIPE_WORKSPACE": str(tmp_path)} if name == "outside-workspace" else {}
    proc = run_component(component, *args, env=env, timeout=300, process=name in IN_A_PROCESS)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (d / "PWNED").exists(), "a pickle payload was executed"
    if code == 0:
        assert needle.format(**fill) in proc.stderr
        return
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"trainpipe {component}: error: ") and needle.format(**fill) in lines[-1], lines[-1]
    assert proc.stdout == ""
    for out in [d / "out", Path("/tmp/trainpipe-elsewhere/out"), d.parent / "escaped"]:
        assert not (out / MARKER).exists()
        assert not list(out.glob("**/.*.tmp")) if out.exists() else True
    assert not (tmp_path.parent / "escaped").exists() and not Path("/tmp/trainpipe-elsewhere").exists()


def test_failed_executions_are_audited_and_the_policy_can_require_the_log(tmp_path, tiny_csv):
    from trainpipe.contract import audit

    log = tmp_path / "audit" / "audit.jsonl"
    env = {"TRAINPIPE_AUDIT_LOG": str(log), "TRAINPIPE_IDENTITY": "svc-trainpipe@team-a"}
    bad = run_component(
        "validate_data", "--data", str(tmp_path / "missing.csv"), "--output-dir", str(tmp_path / "o1"), env=env
    )
    suite = tmp_path / "suite.json"
    suite.write_text(
        json.dumps(
            {
                "name": "strict",
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "f1", "min_value": 100}}
                ],
            }
        )
    )
    failed = run_component(
        "validate_data",
        "--data",
        str(tiny_csv),
        "--output-dir",
        str(tmp_path / "o2"),
        "--label-column",
        "target",
        "--suite",
        str(suite),
        env=env,
    )
    ok = result_of(
        run_component(
            "validate_data",
            "--data",
            str(tiny_csv),
            "--output-dir",
            str(tmp_path / "o3"),
            "--label-column",
            "target",
            env=env,
        )
    )
    refused = run_component(
        "validate_data",
        "--data",
        str(tiny_csv),
        "--output-dir",
        str(tmp_path / "o5"),
        "--result-format",
        "LOUD",
        env=env,
    )
    assert (bad.returncode, failed.returncode, refused.returncode) == (2, 3, 2)
    assert audit.verify(log)["records"] == 4
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["status"], (r.get("error") or {}).get("exit_code")) for r in records] == [
        ("failed", 2),
        ("failed", 3),
        ("ok", None),
        ("failed", 2),
    ]
    assert records[3]["inputs"] == {} and "result_format" in records[3]["error"]["message"]
    assert all(r["who"] == {"identity": "svc-trainpipe@team-a", "source": "TRAINPIPE_IDENTITY"} for r in records)
    assert "suite 'strict' failed" in records[1]["error"]["message"]
    assert (
        records[2]["inputs"]["data"]["md5"] == ok["data_md5"] and records[2]["outputs"]["output_dir"]["marker_sha256"]
    )
    required = run_component(
        "validate_data",
        "--data",
        str(tiny_csv),
        "--output-dir",
        str(tmp_path / "o4"),
        "--label-column",
        "target",
        env={"TRAINPIPE_POLICY": '{"require_audit": true}', "TRAINPIPE_AUDIT_LOG": ""},
    )
    assert (
        required.returncode == 2
        and "audit_log: the policy requires an audit log" in required.stderr.strip().splitlines()[-1]
    )
    assert not (tmp_path / "o4" / MARKER).exists()
