"""snapshot_dataset: the work. DVC is imported inside the functions."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainpipe.components.snapshot_dataset.spec import (
    LOCK_FILE,
    LOCK_WAIT_S,
    NAME,
    REMOTE_SCHEMES,
    SnapshotDatasetConfig,
    SnapshotDatasetResult,
)
from trainpipe.contract.errors import InputError, ServiceUnavailable
from trainpipe.contract.io import atomic_copy, copy_tree_atomic, dataset_digest, link_or_copy
from trainpipe.contract.lineage import Lineage, SnapshotLineage
from trainpipe.contract.locks import exclusive
from trainpipe.contract.policy import Policy
from trainpipe.contract.runtime import Runtime
from trainpipe.contract.text import redact
from trainpipe.data.tabular import SUPPORTED_SUFFIXES, find_dataset

_GIT_ID = [
    "-c",
    "core.quotePath=false",
    "-c",
    "user.name=trainpipe",
    "-c",
    "user.email=trainpipe@localhost",
    "-c",
    "commit.gpgsign=false",
]


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *_GIT_ID, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InputError(
            f"repo_dir: git {args[0]} failed in {str(repo)!r}: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
        )
    return proc.stdout.strip()


def remote_settings(config: SnapshotDatasetConfig, policy: Policy) -> dict[str, Any]:
    """The DVC remote's settings, checked against the policy (scheme, TLS, residency, encryption).

    Raises:
        InputError: the remote is outside what the policy allows, or its scheme is not supported.
    """
    from trainpipe.contract import policy as policy_mod

    url = config.remote_url
    policy_mod.check_scheme("remote_url", url, REMOTE_SCHEMES)
    if "://" not in url:
        if ".." in Path(url).parts:
            raise InputError(
                f"remote_url: {url!r} climbs out with '..' (path traversal is refused; give the path itself)"
            )
        url = str(Path(url).resolve())
    settings: dict[str, Any] = {"url": url}
    # boto's own variables fill what the config leaves unset (a platform sets them on every pod)
    region = config.remote_region or policy_mod.env_region()
    env_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith("s3://"):
        if env_endpoint and not config.remote_endpoint_url:
            policy_mod.check_endpoint("AWS_ENDPOINT_URL_S3", env_endpoint, policy)
        sse = config.remote_sse or policy.sse
        kms = config.remote_sse_kms_key_id or policy.sse_kms_key_id
        if config.remote_endpoint_url:
            policy_mod.check_scheme("remote_endpoint_url", config.remote_endpoint_url, ("http", "https"))
            policy_mod.check_endpoint("remote_endpoint_url", config.remote_endpoint_url, policy)
            settings["endpointurl"] = config.remote_endpoint_url
        if region:
            settings["region"] = region
        policy_mod.check_encryption("remote_sse", url, sse, policy)
        if sse:
            settings["sse"] = sse
            if sse == "aws:kms":
                if not kms:
                    raise InputError(
                        "remote_sse_kms_key_id: aws:kms encryption needs a key id (here or in the policy's "
                        "sse_kms_key_id)"
                    )
                settings["sse_kms_key_id"] = kms
    elif config.remote_region or config.remote_endpoint_url or config.remote_sse:
        raise InputError("remote_region/remote_endpoint_url/remote_sse: apply only to an s3:// remote_url")
    policy_mod.check_location("remote_url", url, region if url.startswith("s3://") else None, policy)
    return settings


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_git_worktree(path: Path) -> bool:
    """Whether ``path`` is the top of a git working tree (a half-made ``.git`` is not)."""
    if not (path / ".git").exists():
        return False
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == path.resolve()


#: What a workspace creation that was cut short can leave behind: nothing of the user's.
_INIT_LEFTOVERS = {".git", ".dvc", ".dvcignore"}


def _create_workspace(repo_dir: Path) -> None:
    """Create the git+DVC workspace beside ``repo_dir`` and rename it into place, so a step killed
    while creating it leaves either no workspace or a whole one; what a killed creation left in
    ``repo_dir`` is replaced. A folder holding anything else is the user's: refused, never touched.

    Raises:
        InputError: ``repo_dir`` exists, is not a git working tree, and holds other files.
    """
    import shutil
    import uuid

    from dvc.repo import Repo

    if repo_dir.exists():
        foreign = sorted(p.name for p in repo_dir.iterdir() if p.name not in _INIT_LEFTOVERS)
        if foreign:
            raise InputError(
                f"repo_dir: {str(repo_dir)!r} exists, is not a git repository and holds files "
                f"({', '.join(foreign[:5])}); "
                "give an empty folder, a git repository, or a new path"
            )
    repo_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in repo_dir.parent.glob(f".{repo_dir.name}.init-*"):  # creations killed before their rename
        shutil.rmtree(stale, ignore_errors=True)
    tmp = repo_dir.parent / f".{repo_dir.name}.init-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    _git(tmp, "init", "-q")
    Repo.init(str(tmp)).close()
    shutil.rmtree(repo_dir, ignore_errors=True)  # only what a killed creation left (checked above)
    os.replace(tmp, repo_dir)


@contextlib.contextmanager
def repo_locked(repo_dir: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the DVC repository ``repo_dir`` alone, creating it first if it is missing.

    Two steps that snapshot into one repository at once (the training and the ingest DAG) would
    otherwise run DVC and git in one working tree together: one's ``git add`` took the other's raw
    file into git, and two creations of a new repository removed each other's half-made one. The
    lock is ``<git dir>/trainpipe-snapshot.lock`` (inside ``.git``, so git never sees it); a
    repository still to be created is created under ``.<name>.lock`` beside it first, by whichever
    step gets there first, and found made by the other.

    Args:
        repo_dir: The workspace.
        wait_s: How long to wait for another step (default ``LOCK_WAIT_S``).

    Raises:
        ServiceUnavailable: another step held the repository (or its creation) for all of ``wait_s``;
            the line names it (pid, host, since). Transient: a retry waits again.
        InputError: ``repo_dir`` cannot be made a workspace, or cannot be locked.
    """
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    what = f"repo_dir: the DVC repository {str(repo_dir)!r}"
    if not _is_git_worktree(repo_dir):
        with exclusive(repo_dir.parent / f".{repo_dir.name}.lock", what=f"{what} (being created)", wait_s=wait_s):
            if not _is_git_worktree(repo_dir):  # the step that held the lock may have made it
                _create_workspace(repo_dir)
    git_dir = Path(_git(repo_dir, "rev-parse", "--absolute-git-dir"))
    with exclusive(git_dir / LOCK_FILE, what=what, wait_s=wait_s):
        yield


def open_repo(repo_dir: Path, remote_name: str, remote: dict[str, Any]) -> Any:
    """Open (creating if needed) the git+DVC workspace and point it at the remote.

    Credentials are never written into the workspace's config: DVC reads them from the
    environment (``AWS_ACCESS_KEY_ID`` … or the pod's role).

    Returns:
        A ``dvc.repo.Repo``.
    """
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    from dvc.repo import Repo

    if not _is_git_worktree(repo_dir):
        _create_workspace(repo_dir)
    elif not (
        repo_dir / ".dvc" / "config"
    ).is_file():  # a git repository of the user's, or a DVC init that was cut short
        Repo.init(str(repo_dir), force=True)
    repo = Repo(str(repo_dir))
    conf = repo.config.read("repo")
    if conf.get("remote", {}).get(remote_name, {}) != remote or conf.get("core", {}).get("remote") != remote_name:
        with repo.config.edit("repo") as edit:
            edit["remote"][remote_name] = dict(remote)
            edit["core"]["remote"] = remote_name
    return repo


def _previous_versions(target: Path) -> list[Path]:
    """What the dataset's folder tracks under another name than ``target``: its previous version
    (a file per month, say), which the new one replaces."""
    if not target.parent.is_dir():
        return []

    def tracked(p: Path) -> bool:
        if not (p.parent / (p.name + ".dvc")).is_file():
            return False
        return p.suffix in SUPPORTED_SUFFIXES if p.is_file() else (p.is_dir() and not p.name.startswith("."))

    return sorted(p for p in target.parent.iterdir() if p.name != target.name and tracked(p))


def _untrack_raw(repo_dir: Path, rel: Path) -> bool:
    """Take the dataset's own bytes out of git's index where git tracks them (a repository that
    two unserialised snapshots left so): DVC refuses to track what git does, and the snapshot's
    commit removes them from git (its history keeps them). Returns whether it did."""
    if not _git(repo_dir, "ls-files", "--", str(rel)):
        return False
    _git(repo_dir, "rm", "-r", "-q", "--cached", "--", str(rel))
    print(f"{NAME}: {rel} was tracked by git; this snapshot's commit hands it to DVC", file=sys.stderr)
    return True


def _commit(repo_dir: Path, rel: Path, previous: list[Path], message: str, *, untracked_raw: bool) -> bool:
    """Stage this snapshot's own paths by name (never a folder: a raw file beside them stays out of
    git) and commit only them: what someone else staged stays staged, out of this commit. Returns
    whether a commit was made.

    Raises:
        InputError: the raw data was just taken out of git and the index holds changes staged by
            someone else (a commit of the raw file's removal takes the whole index).
    """
    dvc_file = rel.with_name(rel.name + ".dvc")
    own = [".dvc/config", ".dvcignore", ".dvc/.gitignore", str(dvc_file), str(rel.parent / ".gitignore")]
    own += [str((p.parent / (p.name + ".dvc")).relative_to(repo_dir)) for p in previous]  # removed records
    tracked = set(_git(repo_dir, "ls-files", "--", *own).splitlines())
    present = [p for p in own if (repo_dir / p).exists() or p in tracked]
    _git(repo_dir, "add", "-A", "--", *present)
    if not untracked_raw:
        if not _git(repo_dir, "diff", "--cached", "--name-only", "--", *present):
            return False
        _git(repo_dir, "commit", "-q", "-m", message, "--", *present)  # --only: these paths, whatever else is staged
        return True
    # the raw file's removal from the index cannot go through --only (it takes the working tree's copy back)
    staged = _git(repo_dir, "diff", "--cached", "--name-only", "--no-renames").splitlines()
    foreign = [p for p in staged if p not in own and Path(p) != rel and rel not in Path(p).parents]
    if foreign:
        raise InputError(
            f"repo_dir: {str(repo_dir)!r} has changes staged by someone else ({', '.join(foreign[:5])}) "
            f"while {rel} leaves git: commit or unstage them, then run the snapshot again"
        )
    _git(repo_dir, "commit", "-q", "-m", message)
    return True


def snapshot_dataset(
    config: SnapshotDatasetConfig, lineage: Lineage, runtime: Runtime | None = None
) -> SnapshotDatasetResult:
    """Add the dataset to the DVC workspace, commit, and push it to the remote.

    The same bytes always give the same md5; a rerun on unchanged data makes no
    commit and pushes nothing.

    Args:
        config: Settings and paths.
        lineage: The lineage so far; ``snapshot`` is added.
        runtime: The platform's settings: the remote is checked against its policy.

    Returns:
        The content hash, git revision, remote and what this run changed.

    Raises:
        InputError: the input is not a dataset, or the workspace cannot be used.
        ServiceUnavailable: the remote cannot be reached or written; the snapshot
            is not reported done and a rerun pushes what is missing.
    """
    src = find_dataset(config.data, "data")
    remote = remote_settings(config, (runtime or Runtime()).policy)
    repo_dir = Path(config.repo_dir).resolve()
    with repo_locked(repo_dir):  # one writer at a time, from the workspace's creation to the output's copy
        return _snapshot_locked(config, lineage, src, remote, repo_dir)


def _snapshot_locked(
    config: SnapshotDatasetConfig, lineage: Lineage, src: Path, remote: dict[str, Any], repo_dir: Path
) -> SnapshotDatasetResult:
    repo = open_repo(repo_dir, config.remote_name, remote)
    rel = Path("data") / config.dataset_name / src.name
    target = repo_dir / rel
    previous = _previous_versions(target)
    for stale in previous:  # last month's file of the same dataset: its record leaves with this commit
        repo.remove(str(stale) + ".dvc", outs=True)  # (git's history and the remote keep it for lineage)
    if previous:
        was = ", ".join(p.name for p in previous)
        print(f"{NAME}: {src.name} is the next version of dataset {config.dataset_name!r} (was {was})", file=sys.stderr)
    if src.is_dir():  # a folder of Parquet files: DVC tracks the folder (one .dir hash)
        if not target.is_dir() or dataset_digest(target, f"{NAME}: hashing the workspace's copy") != dataset_digest(
            src, f"{NAME}: hashing the data"
        ):
            copy_tree_atomic(src, target)
    elif not target.exists() or dataset_digest(target, f"{NAME}: hashing the workspace's copy") != dataset_digest(
        src, f"{NAME}: hashing the data"
    ):
        atomic_copy(src, target)
    untracked_raw = _untrack_raw(repo_dir, rel)
    try:
        (stage,) = repo.add(str(target))
    except Exception as exc:
        raise InputError(f"data: dvc add failed: {exc}") from None
    out = stage.outs[0]
    md5 = out.hash_info.value
    size = int(out.meta.size or target.stat().st_size)
    # Push first, commit after: a snapshot is recorded in git only once its bytes are on the
    # remote, so a push cut short leaves no commit that names missing data.
    try:
        pushed = int(repo.push(targets=[str(target)], remote=config.remote_name) or 0)
    except Exception as exc:
        raise ServiceUnavailable(
            f"remote_url: pushing to DVC remote {redact(config.remote_url)!r} failed: {_first_line(exc)}"
        ) from None
    message = f"snapshot {config.dataset_name}: md5 {md5}"
    staged = _commit(repo_dir, rel, previous, message, untracked_raw=untracked_raw)
    rev = _git(repo_dir, "rev-parse", "HEAD")
    data_file = Path(config.output_dir) / src.name
    if target.is_dir():
        copy_tree_atomic(target, data_file)
    else:
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
    result.lineage = Lineage.of(lineage).with_(
        snapshot=SnapshotLineage(md5=md5, rev=rev, path=str(rel), remote=url, repo=str(repo_dir))
    )
    return result


__all__ = ["NAME", "open_repo", "remote_settings", "repo_locked", "snapshot_dataset"]
