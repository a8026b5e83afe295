"""The MLflow pyfunc of an optimized (ONNX) model that optimize_model made and register_model registered.

MLflow stores this file with the model and runs it on load ("models from code"). It needs
onnxruntime, numpy and pandas, and the loader shipped with the model as ``trainpipe_pyfunc`` for
the predictions' shape, never trainpipe or torch. Input: a DataFrame of the raw feature columns.
Output: the same DataFrame the fp32 version gives (``prediction``, and ``probability_<class>`` per
class for a classifier), so the two are interchangeable behind one serving endpoint.
"""

import json
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class TrainpipeOnnxModel(PythonModel):
    def load_context(self, context):
        import onnxruntime as ort
        from trainpipe_pyfunc.loader import MODEL_META, ONNX_FILE

        folder = Path(context.artifacts["model"])
        self.meta = json.loads((folder / MODEL_META).read_text(encoding="utf-8"))
        if self.meta.get("format") != "trainpipe-onnx/1":
            raise ValueError(f"{folder / MODEL_META} is not a trainpipe-onnx/1 model description")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import numpy as np
        from trainpipe_pyfunc.loader import outputs_frame

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        columns = self.meta["feature_columns"]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ValueError(f"input lacks the feature columns {', '.join(missing[:5])}")
        x = np.ascontiguousarray(frame[columns].to_numpy(dtype=np.float32))
        raw = self.session.run(None, {self.input_name: x})[0]
        if self.meta["task"] == "regression":
            raw = raw.reshape(len(x), -1)
            raw = raw[:, 0] if raw.shape[1] == 1 else raw
        return outputs_frame(raw, self.meta["task"], self.meta.get("classes") or [], frame.index)


mlflow.models.set_model(TrainpipeOnnxModel())
