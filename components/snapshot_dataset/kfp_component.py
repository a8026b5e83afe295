"""KFP v2 face of snapshot_dataset. Holds no logic: it calls the entrypoint."""

from typing import NamedTuple

from kfp.dsl import Dataset, Input, Output

from trainpipe.faces.kfp_face import component


@component
def snapshot_dataset(
    data: Input[Dataset],
    snapshot: Output[Dataset],
    repo_dir: str,
    remote_url: str,
    remote_region: str = "",
    remote_endpoint_url: str = "",
    remote_sse: str = "",
    remote_sse_kms_key_id: str = "",
    remote_name: str = "storage",
    dataset_name: str = "dataset",
    run_id: str = "",
) -> NamedTuple("SnapshotOutputs", [("md5", str), ("rev", str)]):
    """Snapshot the validated data with DVC; its md5 and git revision travel on."""
    from collections import namedtuple

    from trainpipe.faces.kfp_runtime import run_entrypoint

    result = run_entrypoint(
        "snapshot_dataset",
        {
            "data": data.path,
            "output_dir": snapshot.path,
            "repo_dir": repo_dir,
            "remote_url": remote_url,
            "remote_region": remote_region,
            "remote_endpoint_url": remote_endpoint_url,
            "remote_sse": remote_sse,
            "remote_sse_kms_key_id": remote_sse_kms_key_id,
            "remote_name": remote_name,
            "dataset_name": dataset_name,
        },
        run_id=run_id,
        output=snapshot.path,
    )
    snapshot.metadata.update({k: result[k] for k in ("md5", "rev", "remote_url", "path")})
    return namedtuple("SnapshotOutputs", ["md5", "rev"])(result["md5"], result["rev"])
