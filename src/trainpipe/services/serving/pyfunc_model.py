"""The MLflow pyfunc of every model trainpipe registers (MLflow's "models from code").

MLflow stores this file with the model and runs it on load. It imports the loader that travels
with the model as the code path ``trainpipe_pyfunc`` (and a team's own package beside it when
the model is theirs), so ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` work where
trainpipe is not installed. Input: a DataFrame of the raw feature columns. Output: a DataFrame
with ``prediction`` (and ``probability_<class>`` per class for a classifier).
"""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class TrainpipeModel(PythonModel):
    def load_context(self, context):
        from trainpipe_pyfunc import loader

        # The code that builds the model came with it: loading this model means trusting it.
        self.model = loader.load(context.artifacts["model"], trusted=lambda module: True)

    # A DataFrame in and out: the model's signature (the training frame's columns and types) is what
    # MLflow checks the input against; this type hint only says so (and ends MLflow's nudge to add one)
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        return self.model.predict_frame(frame)


mlflow.models.set_model(TrainpipeModel())
