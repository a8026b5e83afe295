"""Which image runs which component: the one place the KFP faces, the Airflow faces and
``make images`` read. Stdlib only.

Three images, built from ``images/Dockerfile`` (``--build-arg KIND=<kind>``), each with its locked requirements
(``images/<kind>/requirements.lock``):

- ``data``: validate_data and snapshot_dataset (Great Expectations, DVC, pandas): no ML framework.
- ``cpu``: every component, with torch (CPU), TensorFlow, Horovod (gloo), MLflow.
- ``gpu``: train_model and profile_training on an accelerator (torch CUDA, NCCL, Horovod with NCCL).

References are ``<registry>/trainpipe-<kind>:<version>``. ``TRAINPIPE_IMAGE_REGISTRY`` names the
registry (your mirror, for an air-gapped cluster); ``TRAINPIPE_IMAGE`` runs every task in one image
of your own instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainpipe import COMPONENTS, __version__

DEFAULT_REGISTRY = "ghcr.io/trainpipe"
#: The non-root user and group every trainpipe image runs as; pod specs ask for the same.
RUN_AS = 10001


@dataclass(frozen=True)
class Image:
    kind: str
    components: tuple[str, ...]
    contents: str


IMAGES: dict[str, Image] = {
    "data": Image(
        "data", ("validate_data", "snapshot_dataset"), "Great Expectations, DVC, Feast, pandas/pyarrow, the kfp runtime"
    ),
    "cpu": Image(
        "cpu",
        COMPONENTS,
        "torch (CPU), TensorFlow, Horovod (gloo), MLflow, GX, DVC, Optuna, matplotlib, the kfp runtime",
    ),
    "gpu": Image(
        "gpu",
        ("train_model", "profile_training"),
        "torch (CUDA 12, cuDNN, NCCL from its wheels), Horovod (NCCL), MLflow, the kfp runtime",
    ),
}


def registry() -> str:
    return os.environ.get("TRAINPIPE_IMAGE_REGISTRY", DEFAULT_REGISTRY).rstrip("/")


def reference(kind: str, tag: str = __version__) -> str:
    """``<registry>/trainpipe-<kind>:<tag>``."""
    if kind not in IMAGES:
        raise ValueError(f"image: {kind!r} is not one of {', '.join(IMAGES)}")
    return f"{registry()}/trainpipe-{kind}:{tag}"


def image_kind(component: str, accelerated: bool = False) -> str:
    """The image a component runs in: ``gpu`` for an accelerated step that image serves, ``data``
    for the data steps, else ``cpu`` (also for a team's own component on the trainpipe contract)."""
    if accelerated and component in IMAGES["gpu"].components:
        return "gpu"
    return "data" if component in IMAGES["data"].components else "cpu"


def image_for(component: str, accelerated: bool = False) -> str:
    """The image reference of one component's task (``TRAINPIPE_IMAGE`` overrides them all)."""
    return os.environ.get("TRAINPIPE_IMAGE") or reference(image_kind(component, accelerated))
