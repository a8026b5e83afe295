"""What a step writes is its owner's and its group's, not every user's: under the default umask 022 a model, its
checkpoints and a run's copies of the data are written 0640 (folders 0750), by the step and by every process it
starts (ranks, DVC, git), as the policy's ``output_umask`` says (027 unless it says otherwise)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import make_snapshot, result_of, run_component

pytestmark = pytest.mark.integration


@contextmanager
def umask(mask: int) -> Iterator[None]:
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def modes(*roots: Path) -> dict[str, str]:
    """Every file and folder under ``roots`` (a git repository's own database left out) -> its mode."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")]:
            if ".git" not in p.relative_to(root.parent).parts:
                out[str(p.relative_to(root.parent))] = oct(stat.S_IMODE(p.lstat().st_mode))
    return out


def test_train_model_under_umask_022_writes_0640_files_and_0750_folders(tmp_path, tiny_csv):
    out, db = tmp_path / "m", tmp_path / "ml.db"
    with umask(0o022):
        r = result_of(
            run_component(
                "train_model",
                *("--data", str(tiny_csv), "--label-column", "target", "--output-dir", str(out)),
                *("--tracking-uri", f"sqlite:///{db}", "--epochs", "1", "--batch-size", "16"),
                *("--nproc-per-node", "1"),
            )
        )
        assert os.umask(0o022) == 0o022  # put back: the step ran in this process
    found = modes(out)
    assert r["global_steps"] > 0 and any("ckpt-" in p for p in found) and "m/model.safetensors" in found, found
    files = {p: m for p, m in found.items() if (tmp_path / p).is_file()}
    folders = {p: m for p, m in found.items() if (tmp_path / p).is_dir()}
    assert set(files.values()) == {"0o640"}, files
    assert set(folders.values()) == {"0o750"}, folders
    assert oct(stat.S_IMODE(db.stat().st_mode)) == "0o640"  # the tracking store it made, too


def test_snapshot_copies_of_the_data_reach_no_other_user_and_the_policy_can_say_otherwise(tmp_path, tiny_csv):
    """DVC marks a verified cache file 0444 (it reads that mode as "verified"): the folders above it are 0750, so
    no other user reaches it. ``output_umask: "022"`` lets every user read a step's output."""
    with umask(0o022):
        make_snapshot(tmp_path, tiny_csv)
    found = modes(tmp_path / "v", tmp_path / "s", tmp_path / "repo", tmp_path / "remote")
    assert "s/tiny.csv" in found and "repo/.dvc/cache/files/md5" in found, sorted(found)
    step_outputs = {p: m for p, m in found.items() if p.split("/")[0] in ("v", "s")}
    assert {m for p, m in step_outputs.items() if (tmp_path / p).is_dir()} == {"0o750"}, step_outputs
    assert {m for p, m in step_outputs.items() if (tmp_path / p).is_file()} == {"0o640"}, step_outputs
    for path, mode in found.items():
        if not int(mode, 8) & 0o007:
            continue
        # only DVC's verified cache files, each in a folder of a folder other users cannot enter
        assert mode == "0o444" and "/files/md5/" in path, (path, mode)
        assert int(found[str(Path(path).parent.parent)], 8) & 0o007 == 0, (path, mode)
    wide = {"TRAINPIPE_POLICY": json.dumps({"output_umask": "022"})}
    with umask(0o022):
        result_of(
            run_component(
                "validate_data",
                *("--data", str(tiny_csv), "--output-dir", str(tmp_path / "w"), "--label-column", "target"),
                env=wide,
            )
        )
    assert oct(stat.S_IMODE((tmp_path / "w" / "validation.json").stat().st_mode)) == "0o644"


def test_an_output_umask_that_is_not_octal_is_one_line_exit_2(tmp_path, tiny_csv):
    bad = run_component(
        "validate_data",
        *("--data", str(tiny_csv), "--output-dir", str(tmp_path / "v"), "--label-column", "target"),
        env={"TRAINPIPE_POLICY": json.dumps({"output_umask": "0o27"})},
    )
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    said = "policy field 'output_umask': String should match pattern '^0?[0-7]{3}$'"
    assert last == f"trainpipe validate_data: error: {said}", last
    assert not (tmp_path / "v").exists()
