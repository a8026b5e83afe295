"""KFP v2 face of register_model: its parameters are the spec's settings (generated); declared here
are its artifacts and its outputs (the registered model's URI and version)."""

from collections import namedtuple
from typing import Any

from trainpipe.components.register_model.spec import NAME, RegisterModelParams
from trainpipe.faces.kfp_face import Face, In, Out

Outputs = namedtuple("RegisterOutputs", ["model_uri", "version"])
SHOWN = ("model_name", "version", "alias", "model_uri", "created", "optimized_model_uri", "signature_sha256")


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> Any:
    artifacts["registration"].metadata.update({k: result[k] or "" for k in SHOWN})
    return Outputs(result["model_uri"] or "", result["version"] or "")


FACE = Face(
    NAME,
    RegisterModelParams,
    [
        In("model", "Model"),
        In("decision", "Artifact"),
        Out("registration", "Artifact", field="output_dir"),
        In("training_profile", "Artifact", optional=True),
        In("optimized", "Model", optional=True),
    ],
    "Register the gated model in MLflow with its lineage (the training profile's too, when given), and "
    "optimize_model's variant beside it; idempotent.",
    publish,
    returns='NamedTuple("RegisterOutputs", [("model_uri", str), ("version", str)])',
)
register_model = FACE.component()
