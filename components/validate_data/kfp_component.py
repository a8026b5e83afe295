"""KFP v2 face of validate_data: its parameters are the spec's settings (generated); declared here
are its artifacts and what the result puts on them."""

from typing import Any

from trainpipe.components.validate_data.spec import NAME, ValidateDataParams
from trainpipe.faces.kfp_face import Face, In, Out


def publish(result: dict[str, Any], artifacts: dict[str, Any]) -> None:
    from trainpipe.faces.kfp_runtime import copy_file

    validated = artifacts["validated"]
    validated.metadata.update({"md5": result["data_md5"], "rows": result["rows"], "suite": result["suite_name"]})
    copy_file(validated.path + "/" + result["docs_page"], artifacts["report"].path)


FACE = Face(
    NAME,
    ValidateDataParams,
    [In("data"), Out("validated", "Dataset", field="output_dir"), Out("report", "HTML")],
    "Run a Great Expectations suite (default: train_model's preconditions); a failed suite fails the task (exit 3).",
    publish,
)
validate_data = FACE.component()
