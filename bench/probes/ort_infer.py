"""optimize_model's selected variant (model.onnx) under ONNX Runtime, one thread, every graph
optimization: timed exactly as bench/baselines/bare_torch_infer.py times torch eager.

python ort_infer.py <optimized model dir> <rows.npy>"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infer_timing import time_predict  # noqa: E402

options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
session = ort.InferenceSession(str(Path(sys.argv[1]) / "model.onnx"), options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
rows = np.load(sys.argv[2])


def predict(x):
    return session.run(None, {name: x})[0]


print(json.dumps(time_predict(predict, rows)))
