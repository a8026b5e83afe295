"""Baseline: the statistics detect_drift computes, called directly with scipy, as a person would
write them: read both tables, sample the same number of rows a side, the normed Wasserstein
distance per column, the share over the threshold. No report, no files, no lineage.

python bare_drift.py REFERENCE.parquet CURRENT.parquet SAMPLE   -> one JSON line: drifted, s
"""

import json
import sys
import time

import numpy as np
import pandas as pd
from scipy.stats import wasserstein_distance

t = time.perf_counter()
ref, cur = pd.read_parquet(sys.argv[1]), pd.read_parquet(sys.argv[2])
n = int(sys.argv[3])
ref = ref.sample(n=min(n, len(ref)), random_state=0)
cur = cur.sample(n=min(n, len(cur)), random_state=1)
drifted = []
for col in ref.columns:
    r, c = ref[col].to_numpy(dtype=float), cur[col].to_numpy(dtype=float)
    if wasserstein_distance(r, c) / max(float(np.std(r)), 0.001) >= 0.1:
        drifted.append(col)
print(json.dumps({"drifted": drifted, "share": len(drifted) / len(ref.columns), "s": time.perf_counter() - t}))
