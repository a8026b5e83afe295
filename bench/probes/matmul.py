"""The cores' own scaling: 300 single-threaded 512x512 matmuls, started at an agreed moment so that
processes launched together run together.

python matmul.py START_UNIX_TIME   -> one JSON line: s (seconds for the 300 matmuls)
"""

import json
import sys
import time

import torch

torch.set_num_threads(1)
a = torch.randn(512, 512)
while time.time() < float(sys.argv[1]):
    time.sleep(0.005)
t = time.perf_counter()
for _ in range(300):
    a @ a
print(json.dumps({"s": time.perf_counter() - t}))
