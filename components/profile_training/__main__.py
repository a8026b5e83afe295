"""Container entrypoint: ``python -m trainpipe.components.profile_training``."""

from trainpipe.components.profile_training.core import profile_training
from trainpipe.components.profile_training.dry import dry_run
from trainpipe.components.profile_training.spec import NAME, ProfileTrainingConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        ProfileTrainingConfig,
        profile_training,
        dry=dry_run,
        doc="Report throughput, step-time breakdown and memory of a training run.",
    )
