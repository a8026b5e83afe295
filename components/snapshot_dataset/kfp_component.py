"""KFP v2 face of snapshot_dataset: its parameters are the spec's settings (generated); declared here
are its artifacts and its outputs (the DVC md5 and git revision, which travel on)."""

from collections import namedtuple
from typing import Any

from trainpipe.components.snapshot_dataset.spec import NAME, SnapshotDatasetParams
from trainpipe.faces.kfp_face import Face, In, Out

Outputs = namedtuple("SnapshotOutputs", ["md5", "rev"])


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> Any:
    artifacts["snapshot"].metadata.update({k: result[k] for k in ("md5", "rev", "remote_url", "path")})
    return Outputs(result["md5"], result["rev"])


FACE = Face(
    NAME,
    SnapshotDatasetParams,
    [In("data"), Out("snapshot", "Dataset", field="output_dir")],
    "Snapshot the validated data with DVC; its md5 and git revision travel on.",
    publish,
    returns='NamedTuple("SnapshotOutputs", [("md5", str), ("rev", str)])',
)
snapshot_dataset = FACE.component()
