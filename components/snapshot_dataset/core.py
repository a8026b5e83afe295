"""snapshot_dataset: the work. DVC is imported inside the functions."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from trainpipe.components.snapshot_dataset.spec import NAME, SnapshotDatasetConfig, SnapshotDatasetResult
from trainpipe.contract.errors import InputError, ServiceUnavailable
from trainpipe.contract.io import atomic_copy, file_digest, link_or_copy
from trainpipe.tabular import find_data_file

_GIT_ID = ["-c", "user.name=trainpipe", "-c", "user.email=trainpipe@localhost", "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *_GIT_ID, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InputError(f"repo_dir: git {args[0]} failed in {str(repo)!r}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return proc.stdout.strip()


def open_repo(repo_dir: Path, remote_name: str, remote_url: str) -> Any:
    """Open (creating if needed) the git+DVC workspace and point it at the remote.

    Returns:
        A ``dvc.repo.Repo``.
    """
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    from dvc.repo import Repo

    repo_dir.mkdir(parents=True, exist_ok=True)
    if not (repo_dir / ".git").exists():
        _git(repo_dir, "init", "-q")
    repo = Repo(str(repo_dir)) if (repo_dir / ".dvc").is_dir() else Repo.init(str(repo_dir))
    url = remote_url if "://" in remote_url else str(Path(remote_url).resolve())
    conf = repo.config.read("repo")
    if conf.get("remote", {}).get(remote_name, {}).get("url") != url or conf.get("core", {}).get("remote") != remote_name:
        with repo.config.edit("repo") as edit:
            edit["remote"][remote_name] = {"url": url}
            edit["core"]["remote"] = remote_name
    return repo


def snapshot_dataset(config: SnapshotDatasetConfig, lineage: dict[str, Any]) -> SnapshotDatasetResult:
    """Add the dataset to the DVC workspace, commit, and push it to the remote.

    The same bytes always give the same md5; a rerun on unchanged data makes no
    commit and pushes nothing.

    Args:
        config: Settings and paths.
        lineage: The lineage so far; ``snapshot`` is added.

    Returns:
        The content hash, git revision, remote and what this run changed.

    Raises:
        InputError: the input is not a dataset, or the workspace cannot be used.
        ServiceUnavailable: the remote cannot be reached or written; the snapshot
            is not reported done and a rerun pushes what is missing.
    """
    src = find_data_file(config.data, "data")
    repo_dir = Path(config.repo_dir).resolve()
    repo = open_repo(repo_dir, config.remote_name, config.remote_url)
    rel = Path("data") / config.dataset_name / src.name
    target = repo_dir / rel
    for stale in target.parent.glob("*") if target.parent.exists() else []:
        if stale.is_file() and stale.name != src.name and stale.suffix in {".csv", ".parquet", ".pq"}:
            raise InputError(f"dataset_name: {config.dataset_name!r} already tracks {stale.name!r}; use another dataset_name per file")
    src_md5 = file_digest(src)
    if not target.exists() or file_digest(target) != src_md5:
        atomic_copy(src, target)
    try:
        (stage,) = repo.add(str(target))
    except Exception as exc:
        raise InputError(f"data: dvc add failed: {exc}") from None
    out = stage.outs[0]
    md5 = out.hash_info.value
    size = int(out.meta.size or target.stat().st_size)
    dvc_file = rel.with_name(rel.name + ".dvc")
    _git(repo_dir, "add", "--", ".dvc/config", ".dvcignore", ".dvc/.gitignore", str(dvc_file), str(rel.parent / ".gitignore"))
    staged = subprocess.run(["git", "-C", str(repo_dir), "diff", "--cached", "--quiet"], check=False).returncode != 0
    if staged:
        _git(repo_dir, "commit", "-q", "-m", f"snapshot {config.dataset_name}: md5 {md5}")
    rev = _git(repo_dir, "rev-parse", "HEAD")
    try:
        pushed = int(repo.push(targets=[str(target)], remote=config.remote_name) or 0)
    except Exception as exc:
        raise ServiceUnavailable(f"remote_url: pushing to DVC remote {config.remote_url!r} failed: {str(exc).strip() or type(exc).__name__}") from None
    data_file = Path(config.output_dir) / src.name
    link_or_copy(target, data_file)
    url = repo.config["remote"][config.remote_name]["url"]
    result = SnapshotDatasetResult(
        md5=md5,
        size=size,
        rev=rev,
        path=str(rel),
        repo_dir=str(repo_dir),
        remote_name=config.remote_name,
        remote_url=url,
        pushed=pushed,
        committed=staged,
        data_file=src.name,
    )
    lineage = dict(lineage)
    lineage["snapshot"] = {"md5": md5, "rev": rev, "path": str(rel), "remote": url, "repo": str(repo_dir)}
    result.lineage = lineage
    return result


__all__ = ["NAME", "open_repo", "snapshot_dataset"]
