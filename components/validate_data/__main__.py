"""Container entrypoint: ``python -m trainpipe.components.validate_data``."""

from trainpipe.components.validate_data.core import validate_data
from trainpipe.components.validate_data.dry import dry_run
from trainpipe.components.validate_data.spec import NAME, ValidateDataConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        ValidateDataConfig,
        validate_data,
        dry=dry_run,
        doc="Run a Great Expectations suite on a CSV/Parquet dataset.",
    )
