"""trainpipe's signing of a model folder, as register_model signs and a loader verifies (the keys
in TRAINPIPE_SIGNING_KEY / TRAINPIPE_VERIFY_KEY): the seconds of the import and of the work apart.

python sign_probe.py sign|verify|verify-in-evaluate <model dir>

verify-in-evaluate first imports what evaluate_model has imported by the time it loads its champion
(torch, mlflow's client, pandas, scikit-learn's metrics), so the import counted is what verification
adds to that step."""

import json
import sys
import time
from pathlib import Path

if sys.argv[1] == "verify-in-evaluate":
    import mlflow  # noqa: F401
    import pandas  # noqa: F401
    import sklearn.metrics  # noqa: F401
    import torch  # noqa: F401
    from mlflow import MlflowClient  # noqa: F401

t0 = time.perf_counter()
from trainpipe.services import signing  # noqa: E402

if sys.argv[1] == "sign":
    import model_signing.signing  # noqa: F401  (what sign() imports, timed as import)
else:
    import model_signing.verifying  # noqa: F401
t1 = time.perf_counter()
folder = Path(sys.argv[2])
if sys.argv[1] == "sign":
    signing.sign(folder)
else:
    signing.verify(folder, "bench model", required=True)
t2 = time.perf_counter()
mb = sum(p.stat().st_size for p in folder.iterdir() if p.name != signing.SIGNATURE_FILE) / 1e6
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "mb": mb}))
