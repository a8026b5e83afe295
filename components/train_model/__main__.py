"""Container entrypoint: ``python -m trainpipe.components.train_model``."""

from trainpipe.components.train_model.core import train_model
from trainpipe.components.train_model.dry import dry_run
from trainpipe.components.train_model.spec import NAME, TrainModelConfig
from trainpipe.contract.entrypoint import main

if __name__ == "__main__":
    main(
        NAME,
        TrainModelConfig,
        train_model,
        dry=dry_run,
        doc="Train a model (torch DDP, TensorFlow multi-worker or Horovod) and log it to MLflow.",
    )
