"""Container entrypoint: ``python -m trainpipe.components.detect_drift``."""

from trainpipe.components.detect_drift.core import detect_drift
from trainpipe.components.detect_drift.dry import dry_run
from trainpipe.components.detect_drift.spec import NAME, DetectDriftConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        DetectDriftConfig,
        detect_drift,
        dry=dry_run,
        doc="Compare a new snapshot with the champion's training data and decide whether to retrain.",
    )
