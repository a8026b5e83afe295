"""validate_data: run a Great Expectations 1.x suite on a CSV or Parquet dataset."""
