"""The decorator every KFP face uses: our image, no run-time pip installs.

Air-gapped clusters cannot ``pip install`` at run time, so components run in the
trainpipe image with kfp already inside (``install_kfp_package=False``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from kfp import dsl

#: The component image. Override with TRAINPIPE_IMAGE when compiling for your registry.
DEFAULT_IMAGE = "ghcr.io/trainpipe/trainpipe-cpu:0.1.0"


def image() -> str:
    return os.environ.get("TRAINPIPE_IMAGE", DEFAULT_IMAGE)


def component(func: Callable[..., Any]) -> Any:
    """``@dsl.component`` with the trainpipe image and no packages installed at run time."""
    return dsl.component(func, base_image=image(), install_kfp_package=False)
