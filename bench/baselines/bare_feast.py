"""Baseline: a training set built with Feast by hand, as its documentation shows: the entity table
read, its timestamps parsed, ``get_historical_features`` on the feature service, the result written
as Parquet.

python bare_feast.py REPO SERVICE ENTITY.csv OUT.parquet   -> one JSON line: rows, s
"""

import json
import sys
import time

import pandas as pd
from feast import FeatureStore

t = time.perf_counter()
store = FeatureStore(repo_path=sys.argv[1])
entity = pd.read_csv(sys.argv[3])
entity["event_timestamp"] = pd.to_datetime(entity["event_timestamp"], utc=True)
df = store.get_historical_features(entity_df=entity, features=store.get_feature_service(sys.argv[2])).to_df()
df.to_parquet(sys.argv[4], index=False)
print(json.dumps({"rows": len(df), "s": time.perf_counter() - t}))
