"""snapshot_dataset: typed config and result. Imports nothing heavy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainpipe.contract.config import StrictModel
from trainpipe.contract.entrypoint import INPUT, OUTPUT
from trainpipe.contract.result import ComponentResult

NAME = "snapshot_dataset"
SNAPSHOT_FILE = "snapshot.json"
#: The DVC remotes snapshot_dataset can push to (``file``: a local or mounted path).
REMOTE_SCHEMES = ("file", "s3")
#: The lock a snapshot holds on its DVC repository, in the repository's git directory.
LOCK_FILE = "trainpipe-snapshot.lock"
#: How long a snapshot waits for another to finish with the repository, then exits 75 (retried).
#: Pushing a large dataset to a remote is what a waiter waits for.
LOCK_WAIT_S = 900.0


class SnapshotDatasetParams(StrictModel):
    """Settings of snapshot_dataset that are not artifacts."""

    repo_dir: str = Field(
        ..., min_length=1, description="the git+DVC workspace that tracks snapshots (created if missing)"
    )
    remote_url: str = Field(
        ..., min_length=1, description="DVC remote: a local directory, or s3://, gs://, azure:// … URL"
    )
    remote_region: str | None = Field(None, description="the S3 remote's region (data residency is checked against it)")
    remote_endpoint_url: str | None = Field(
        None, description="an S3-compatible endpoint (MinIO, Ceph …); AWS when unset"
    )
    remote_sse: Literal["AES256", "aws:kms"] | None = Field(
        None, description="server-side encryption of the S3 remote's objects (default: the policy's sse)"
    )
    remote_sse_kms_key_id: str | None = Field(
        None, description="the KMS key of aws:kms encryption (default: the policy's)"
    )
    remote_name: str = Field("storage", pattern=r"^[A-Za-z0-9_-]+$", description="the DVC remote's name")
    dataset_name: str = Field(
        "dataset",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="the dataset's folder in the workspace: data/<name>/",
    )


class SnapshotDatasetConfig(SnapshotDatasetParams):
    """Everything snapshot_dataset needs, artifacts included."""

    data: str = Field(
        ...,
        min_length=1,
        description="the validated dataset artifact (validate_data's output)",
        json_schema_extra=INPUT,
    )
    output_dir: str = Field(
        ..., min_length=1, description="where the snapshot reference and data go", json_schema_extra=OUTPUT
    )


class SnapshotDatasetResult(ComponentResult):
    """What snapshot_dataset reports."""

    md5: str = Field(description="content hash of the dataset (DVC's md5; a folder's ends in .dir)")
    size: int = Field(description="bytes snapshotted")
    rev: str = Field(description="git commit of the workspace that records this snapshot")
    path: str = Field(description="the dataset's path inside the workspace")
    repo_dir: str = Field(description="the DVC repository")
    remote_name: str = Field(description="the DVC remote pushed to")
    remote_url: str = Field(description="its URL (credentials never included)")
    pushed: int = Field(description="files uploaded to the remote by this run (0 when already there)")
    committed: bool = Field(description="whether this run made a new git commit")
    data_file: str = Field(description="the dataset (a file, or a folder of .parquet files) inside output_dir")

    def figures(self) -> dict[str, float]:
        return {"bytes": float(self.size)}

    def summary(self) -> str:
        return f"md5 {self.md5} at rev {self.rev[:12]} on {self.remote_url} ({self.pushed} pushed)"
