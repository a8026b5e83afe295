"""Baseline: the default suite's rules as plain pandas checks (read, label present, enough rows),
what a person would write without a validation library.

python bare_pandas.py DATA.csv LABEL   -> one JSON line: ok, s
"""

import json
import sys
import time

import pandas as pd

t = time.perf_counter()
df = pd.read_csv(sys.argv[1])
label = sys.argv[2]
ok = len(df) >= 1 and label in df.columns and not df[label].isna().any()
print(json.dumps({"ok": bool(ok), "s": time.perf_counter() - t}))
