"""trainpipe: reusable, containerized ML pipeline components.

Importing this package loads no ML framework, no data tooling and no
orchestrator SDK; the heavy parts are imported where they are used.
"""

import os
from importlib.util import find_spec

from trainpipe.contract import moved
from trainpipe.contract.plugins import defer_feast_headers

__version__ = "0.1.0"

# Feast's MLflow plugin would otherwise load all of Feast into every process that imports MLflow.
defer_feast_headers()
# the library's modules that moved into folders keep their old names for one release (with a warning)
moved.install()

#: What makes a folder of ``trainpipe.components`` a component: this file in it (name, stability, image...).
METADATA = "metadata.yaml"


def _found_components() -> tuple[str, ...]:
    """The components' names, found from their folders: each folder of ``trainpipe.components`` that holds a
    ``metadata.yaml``, sorted. Only the folders are listed (no module of theirs is imported, no file parsed),
    from wherever the namespace lies: this checkout (pyproject's package-dir) or an installed wheel."""
    spec = find_spec(f"{__name__}.components")  # its folder, without importing the package
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return tuple(
        sorted(
            {
                entry.name
                for root in roots
                for entry in os.scandir(root)
                if entry.is_dir() and entry.name.isidentifier() and os.path.isfile(os.path.join(entry.path, METADATA))
            }
        )
    )


#: Every component, by its folder's name (``components/<name>/metadata.yaml``), sorted: adding a folder adds one.
COMPONENTS = _found_components()

__all__ = ["COMPONENTS", "METADATA", "__version__"]
