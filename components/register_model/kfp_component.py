"""KFP v2 face of register_model. Holds no logic: it calls the entrypoint."""

from typing import NamedTuple

from kfp.dsl import Artifact, Input, Model, Output

from trainpipe.faces.kfp_face import component


@component
def register_model(
    model: Input[Model],
    decision: Input[Artifact],
    registration: Output[Artifact],
    profile: Input[Artifact] = None,
    optimized: Input[Model] = None,
    model_name: str = "trainpipe-model",
    alias: str = "champion",
    challenger_alias: str = "challenger",
    intended_use: str = "Predictions on rows shaped like the training snapshot. Not assessed for other populations or for decisions about people without review.",
    tracking_uri: str = "",
    optimized_model_name: str = "",
    move_alias: bool = True,
    run_id: str = "",
) -> NamedTuple("RegisterOutputs", [("model_uri", str), ("version", str)]):
    """Register the gated model in MLflow with its lineage (the profile's too, when given), and optimize_model's variant beside it; idempotent."""
    from collections import namedtuple

    from trainpipe.faces.kfp_runtime import run_entrypoint

    result = run_entrypoint(
        "register_model",
        {
            "model": model.path,
            "decision": decision.path,
            "profile": profile.path if profile is not None else "",
            "optimized": optimized.path if optimized is not None else "",
            "optimized_model_name": optimized_model_name,
            "output_dir": registration.path,
            "model_name": model_name,
            "alias": alias,
            "challenger_alias": challenger_alias,
            "intended_use": intended_use,
            "tracking_uri": tracking_uri,
            "move_alias": move_alias,
        },
        run_id=run_id,
        output=registration.path,
    )
    registration.metadata.update(
        {
            k: result[k] or ""
            for k in (
                "model_name",
                "version",
                "alias",
                "model_uri",
                "created",
                "optimized_model_uri",
                "signature_sha256",
            )
        }
    )
    return namedtuple("RegisterOutputs", ["model_uri", "version"])(result["model_uri"] or "", result["version"] or "")
