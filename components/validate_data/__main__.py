"""Container entrypoint: ``python -m trainpipe.components.validate_data``."""

import os

# This process is a component's entrypoint, not a library user's: skip pydantic's plugin discovery
# (a scan of every installed distribution's entry points, ~50-80 ms per step start) unless asked for.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from trainpipe.components.validate_data.core import validate_data
from trainpipe.components.validate_data.spec import NAME, ValidateDataConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(NAME, ValidateDataConfig, validate_data, doc="Run a Great Expectations suite on a CSV/Parquet dataset.")
