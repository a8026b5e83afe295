"""Baseline: the same Great Expectations suite run directly (ephemeral context, pandas
datasource), as a person would without trainpipe.

python bare_gx.py DATA.csv SUITE.json LABEL   -> prints one JSON line: success, seconds
"""

import json
import sys
import time

import great_expectations as gx
import pandas as pd


def main() -> None:
    path, suite_path, label = sys.argv[1:4]
    t0 = time.perf_counter()
    df = pd.read_csv(path)
    context = gx.get_context(mode="ephemeral")
    batch = (
        context.data_sources.add_pandas("bench").add_dataframe_asset("data").add_batch_definition_whole_dataframe("all")
    )
    spec = json.loads(open(suite_path).read().replace("{label_column}", label))
    expectations = [
        getattr(gx.expectations, "".join(p.title() for p in e["type"].split("_")))(**e["kwargs"])
        for e in spec["expectations"]
    ]
    suite = context.suites.add(
        gx.ExpectationSuite(name=spec["name"], expectations=expectations)
    )  # one save, not one per expectation
    vd = context.validation_definitions.add(gx.ValidationDefinition(name="bench", data=batch, suite=suite))
    result = vd.run(batch_parameters={"dataframe": df})
    context.build_data_docs()
    print(json.dumps({"success": bool(result.success), "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
