"""kfp's client, loaded when it is named rather than with every ``import kfp``. Stdlib only; nothing of kfp is
imported here until kfp itself is.

``import kfp`` loads ``kfp.client`` (the API server's generated client and the Kubernetes client: about 1 s of one
core) unless ``_KFP_RUNTIME`` is set, as it is inside a KFP task, yet building a pipeline, compiling it and
``kfp.local`` never use it. :func:`defer_kfp_client`, called where the faces, the pipelines and the application are
imported (before their own kfp), has kfp's ``__init__`` run as inside a task, for that moment only, and gives the
package a module ``__getattr__`` (PEP 562) for what it then leaves out: ``kfp.Client``, ``kfp.client``,
``kfp.components`` and ``kfp.dsl`` load on first use. A kfp imported before them is left as it is.
"""

from __future__ import annotations

import sys
from typing import Any


def _kfp_attribute(name: str) -> Any:
    """``kfp.<name>`` for what ``import kfp`` would have loaded (PEP 562), imported on first use. Read from
    ``sys.modules``: a subpackage still initialising is not yet an attribute of kfp."""
    if name in ("Client", "client"):
        import kfp.client  # noqa: F401

        client = sys.modules["kfp.client"]
        return client.Client if name == "Client" else client
    if name == "components":
        import kfp.components  # noqa: F401

        return sys.modules["kfp.components"]
    if name == "dsl":
        import kfp.dsl  # noqa: F401

        return sys.modules["kfp.dsl"]
    raise AttributeError(f"module 'kfp' has no attribute {name!r}")


class _KfpWithoutClient:
    """A finder asked once, for ``kfp`` itself: the installed package, whose ``__init__`` runs as inside a KFP task
    (``_KFP_RUNTIME``, set for that moment only), with :func:`_kfp_attribute` for what it then leaves out."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery
        import os

        if name != "kfp":
            return None
        if cls in sys.meta_path:
            sys.meta_path.remove(cls)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: Any) -> None:
            before = os.environ.get("_KFP_RUNTIME")
            os.environ["_KFP_RUNTIME"] = "true"
            try:
                run(module)
            finally:
                if before is None:
                    del os.environ["_KFP_RUNTIME"]
                else:
                    os.environ["_KFP_RUNTIME"] = before
            if before != "true":
                module.__getattr__ = _kfp_attribute

        spec.loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]  # this spec's own loader
        return spec


def defer_kfp_client() -> None:
    """Before kfp is imported: ``import kfp`` loads only the package, as inside a KFP task (``_KFP_RUNTIME``), and
    its client and subpackages load when they are first named (``kfp.Client``, ``from kfp import dsl``). Compiling
    and ``kfp.local`` never use the client: every process that builds or runs a pipeline (``trainpipe run``, its
    engine, ``trainpipe compile``) starts about 1 s sooner. Nothing of kfp is imported here.

    Idempotent; without effect where kfp is already imported."""
    if "kfp" not in sys.modules and _KfpWithoutClient not in sys.meta_path:
        sys.meta_path.insert(0, _KfpWithoutClient)
