"""Baseline: a trained MLP in torch eager, as a person would serve it by hand: the weights loaded
into the network, ``torch.inference_mode``, one thread. Prints p50 latency at batch 1 and rows a
second at batch 256 on the given rows, timed exactly as bench/probes/ort_infer.py times ONNX Runtime.

python bare_torch_infer.py <model dir> <rows.npy>"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes"))
from infer_timing import time_predict  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src" / "trainpipe" / "serving"))
from nets import mlp  # noqa: E402  (torch only: the network definition)

torch.set_num_threads(1)
model_dir, rows = Path(sys.argv[1]), np.load(sys.argv[2])
meta = json.loads((model_dir / "model.json").read_text())
net = mlp(**meta["init_args"])
net.load_state_dict(load_file(str(model_dir / "model.safetensors")))
net.eval()


def predict(x):
    with torch.inference_mode():
        return net(torch.from_numpy(x)).numpy()


print(json.dumps(time_predict(predict, rows)))
