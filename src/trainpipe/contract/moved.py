"""The library's modules that moved into folders by layer (``services/``, ``data/``, the contract's
``layout``, ``resources`` and ``tasks``, ``training/torch/`` and ``training/tf/``): each old name keeps
working for one release, with a DeprecationWarning that names the new one.

A team's code, a pickled model (a class is pickled by its module's name) and an MLflow model logged as code
name trainpipe's modules by path; an old name resolves to the moved module itself, one module object under
both names, so ``isinstance`` and pickling agree whichever name was used. Stdlib only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: Each moved module's old name and its new one (a package's submodules follow it).
MOVED = {
    **{
        f"trainpipe.{m}": f"trainpipe.services.{m}"
        for m in (
            "costs",
            "gate",
            "images",
            "lineage_report",
            "pods",
            "profiles",
            "promote",
            "registry",
            "runs",
            "serving",
            "signing",
            "slurm",
            "telemetry",
            "tracking",
        )
    },
    **{
        f"trainpipe.{m}": f"trainpipe.data.{m}"
        for m in ("drift", "feature_sets", "preconditions", "scoring", "splits", "tabular")
    },
    **{f"trainpipe.{m}": f"trainpipe.contract.{m}" for m in ("layout", "resources", "tasks")},
    **{
        f"trainpipe.training.{old}": f"trainpipe.training.torch.{new}"
        for old, new in (
            ("torch_context", "context"),
            ("torch_data", "data"),
            ("torch_model", "model"),
            ("torch_profiling", "profiling"),
            ("torch_state", "state"),
            ("torch_strategies", "strategies"),
            ("torch_timing", "timing"),
            ("builtin_torch", "builtin"),
        )
    },
    **{
        f"trainpipe.training.{old}": f"trainpipe.training.tf.{new}"
        for old, new in (
            ("tf_context", "context"),
            ("tf_model", "model"),
            ("tf_strategy", "strategy"),
            ("builtin_tf", "builtin"),
        )
    },
}


def new_name(name: str) -> str | None:
    """The module's new name, where ``name`` (or the package it lies in) moved; else None."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the moved module (imported under its new name first)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if new_name(name) else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        moved = str(new_name(spec.name))
        warnings.warn(
            f"{spec.name} moved to {moved}; the old name goes in the next release", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(moved)  # noqa: TID251 (a library module named in MOVED, never a layer above)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the moved module ran under its new name."""


def install() -> None:
    """Resolve the old names from now on (``import trainpipe`` does it once)."""
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())  # before an editable install's finder, which knows the old files
