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
    result_of(run_component("train_model", "--data", str(root / "s"), "--output-dir", str(root / "m"), "--label-column", "target",
                            "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}", "--nproc-per-node", "1", "--epochs", "1"))
    return {"model": root / "m", "snap": root / "s"}


def materialize(d: Path, files: dict, art: dict) -> None:
    for rel, content in files.items():
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.startswith("model/") and not (d / "model").joinpath("trainpipe.json").exists():
            shutil.copytree(art["model"], d / "model", dirs_exist_ok=True)
        if callable(content):
            path.write_bytes(content(d))
        elif isinstance(content, str) and content.startswith("ARCH:"):
            meta = json.loads(path.read_text())
            meta["arch"] = content[len("ARCH:"):]
            path.write_text(json.dumps(meta))
        else:
            path.write_text(content)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, artifacts, case, monkeypatch):
    name, component, args, files, code, needle = case
    d = tmp_path / "case"
    d.mkdir()
    materialize(d, files, artifacts)
    fill = {"d": str(d), "model": str(artifacts["model"]), "snap": str(artifacts["snap"])}
    args = [a.format(**fill) for a in args]
    env = {"TRAINPIPE_WORKSPACE": str(tmp_path)} if name == "outside-workspace" else {}
    proc = run_component(component, *args, env=env, timeout=300)
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
