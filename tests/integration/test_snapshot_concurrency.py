"""Two snapshot_dataset processes into one DVC repository at once, as the training and the ingest DAG run
them: both land, one after the other. Before the repository was locked, one of two snapshots of one dataset
exited 2 and left the raw CSV committed to git (every later snapshot then failed), and two that created a new
repository ended in an internal error.

Real DVC with a local remote, real processes (``python -m trainpipe.components.snapshot_dataset``), started
together: each imports DVC, says it is ready and waits for a file the test creates once both are (no fixed
sleep), so they meet in the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import result_of, run_component

pytestmark = pytest.mark.integration

#: A snapshot process that starts its work when ``go`` appears (its imports done before, so both start together).
_AT_ONCE = """
import os, runpy, sys, time
import dvc.repo  # noqa: F401
import trainpipe.components.snapshot_dataset.core  # noqa: F401
ready, go = sys.argv[1:3]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
sys.argv = ["trainpipe.components.snapshot_dataset", *sys.argv[3:]]
runpy.run_module("trainpipe.components.snapshot_dataset", run_name="__main__", alter_sys=True)
"""


def _csv(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("f1,f2,target\n" + "".join(f"{seed + i},{i * seed % 7},{i % 2}\n" for i in range(20)))
    return path


def _at_once(tmp_path: Path, runs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start every run, wait until each has imported DVC, then let them go at the same instant."""
    go = tmp_path / "go"
    procs = []
    for i, args in enumerate(runs):
        ready = tmp_path / f"ready-{i}"
        cmd = [sys.executable, "-c", _AT_ONCE, str(ready), str(go), *args]
        procs.append((ready, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    deadline = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in procs):
        assert time.monotonic() < deadline and all(p.poll() is None for _, p in procs), "a run never got ready"
        time.sleep(0.01)
    go.touch()
    done = []
    for _, p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("repo_exists", [False, True], ids=["new-repo", "existing-repo"])
@pytest.mark.parametrize("datasets", [("same", "same"), ("a", "b")], ids=["one-dataset", "two-datasets"])
def test_two_snapshots_at_once_both_land_and_the_repo_stays_clean(tmp_path, repo_exists, datasets):
    from dvc.repo import Repo

    repo, remote = tmp_path / "ws" / "dvc-repo", tmp_path / "ws" / "dvc-remote"
    common = ["--repo-dir", str(repo), "--remote-url", str(remote)]
    if repo_exists:
        seed = _csv(tmp_path / "seed" / "seed.csv", 99)
        args = ["--data", str(seed), "--dataset-name", "seed", "--output-dir", str(tmp_path / "s-seed")]
        result_of(run_component("snapshot_dataset", *args, *common))
    # two versions of one file of one dataset (both write data/same/part.csv), or two datasets
    runs = [
        ["--data", str(_csv(tmp_path / f"in{i}" / "part.csv", i + 1)), "--dataset-name", name]
        + ["--output-dir", str(tmp_path / f"s{i}"), *common]
        for i, name in enumerate(datasets)
    ]
    procs = _at_once(tmp_path, runs)
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(proc.stdout.strip().splitlines()[-1]) for proc in procs]

    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    tracked = _git(repo, "ls-files").split()
    assert not [f for f in tracked if f.endswith(".csv")], tracked  # only DVC's records, never the data
    for r in results:
        assert r["committed"] and len({r["md5"] for r in results}) == 2
        # its revision exists and records its bytes; the bytes are on the remote
        record = _git(repo, "show", f"{r['rev']}:{r['path']}.dvc")
        assert f"md5: {r['md5']}" in record
        assert (remote / "files" / "md5" / r["md5"][:2] / r["md5"][2:]).is_file()
    assert len({r["rev"] for r in results}) == 2
    revs = _git(repo, "rev-list", "HEAD").split()
    assert {r["rev"] for r in results} <= set(revs)  # one after the other, on one line of history
    with Repo(str(repo)) as dvc:
        assert dvc.status() == {} and dvc.status(cloud=True) == {}


def test_a_snapshot_that_waits_too_long_exits_75_naming_the_holder(tmp_path, monkeypatch):
    """The wait is bounded: past it the step is transient (75, retried with backoff), its one line says who holds
    the repository, and nothing of the repository was touched."""
    import os
    import socket

    from trainpipe.components.snapshot_dataset import core
    from trainpipe.components.snapshot_dataset.spec import LOCK_FILE
    from trainpipe.contract.locks import exclusive

    repo = tmp_path / "dvc-repo"
    common = ["--repo-dir", str(repo), "--remote-url", str(tmp_path / "remote"), "--dataset-name", "d"]
    first = result_of(
        run_component(
            "snapshot_dataset",
            "--data",
            str(_csv(tmp_path / "a.csv", 1)),
            "--output-dir",
            str(tmp_path / "s1"),
            *common,
        )
    )
    monkeypatch.setattr(core, "LOCK_WAIT_S", 0.2)
    with exclusive(repo / ".git" / LOCK_FILE, what="test", wait_s=0):
        data = str(_csv(tmp_path / "b.csv", 2))
        proc = run_component("snapshot_dataset", "--data", data, "--output-dir", str(tmp_path / "s2"), *common)
    assert proc.returncode == 75
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"trainpipe snapshot_dataset: error: repo_dir: the DVC repository {str(repo)!r} is locked by "
    )
    assert f"pid {os.getpid()} on {socket.gethostname()} since " in line and "waited 0.2 s" in line
    assert _git(repo, "rev-parse", "HEAD").strip() == first["rev"] and not (repo / "data" / "d" / "b.csv").exists()


def test_a_repository_left_with_raw_data_in_git_is_repaired_by_the_next_snapshot(tmp_path):
    """What two unserialised snapshots left (the raw CSV committed to git) made every later snapshot exit 2
    ("already tracked by SCM") until a person ran ``git rm --cached``: the next snapshot takes it out itself."""
    repo = tmp_path / "dvc-repo"
    common = ["--repo-dir", str(repo), "--remote-url", str(tmp_path / "remote"), "--dataset-name", "d"]
    data = _csv(tmp_path / "in" / "a.csv", 1)
    result_of(run_component("snapshot_dataset", "--data", str(data), "--output-dir", str(tmp_path / "s1"), *common))
    _git(repo, "add", "-f", "data/d/a.csv")
    _git(repo, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q", "-m", "the raw file, by mistake")
    _csv(data, 2)
    proc = run_component("snapshot_dataset", "--data", str(data), "--output-dir", str(tmp_path / "s2"), *common)
    second = result_of(proc)
    assert "data/d/a.csv was tracked by git; this snapshot's commit hands it to DVC" in proc.stderr
    assert second["committed"] and _git(repo, "ls-files").split() == [
        ".dvc/.gitignore",
        ".dvc/config",
        ".dvcignore",
        "data/d/.gitignore",
        "data/d/a.csv.dvc",
    ]
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_snapshot_commits_only_its_own_paths(tmp_path):
    """What someone else staged in the repository (here a file of a person's) stays staged, out of the commit."""
    repo = tmp_path / "dvc-repo"
    common = ["--repo-dir", str(repo), "--remote-url", str(tmp_path / "remote"), "--dataset-name", "d"]
    data = _csv(tmp_path / "in" / "a.csv", 1)
    result_of(run_component("snapshot_dataset", "--data", str(data), "--output-dir", str(tmp_path / "s1"), *common))
    (repo / "notes.txt").write_text("a person's\n")
    _git(repo, "add", "notes.txt")
    _csv(data, 2)
    second = result_of(
        run_component("snapshot_dataset", "--data", str(data), "--output-dir", str(tmp_path / "s2"), *common)
    )
    assert second["committed"]
    assert _git(repo, "show", "--name-only", "--format=", second["rev"]).split() == ["data/d/a.csv.dvc"]
    assert _git(repo, "status", "--porcelain").splitlines() == ["A  notes.txt"]
