"""The decorator every KFP face uses: our image, no run-time pip installs.

Air-gapped clusters cannot ``pip install`` at run time, so components run in the
trainpipe image with kfp already inside (``install_kfp_package=False``). Which image
runs which component is decided in :mod:`trainpipe.images`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kfp import dsl

from trainpipe.images import image_for


def component(func: Callable[..., Any]) -> Any:
    """``@dsl.component`` in the component's trainpipe image, no packages installed at run time."""
    return dsl.component(func, base_image=image_for(func.__name__), install_kfp_package=False)


def accelerated(comp: Any) -> Any:
    """The same component in the image for an accelerator (the GPU image, where it serves it)."""
    func = comp.python_func
    return dsl.component(func, base_image=image_for(func.__name__, accelerated=True), install_kfp_package=False)
