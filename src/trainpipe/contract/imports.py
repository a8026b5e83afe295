"""Importing a module named at run time: a team's training function, metric or model builder, the built-in
or strategy the settings choose.

The one place trainpipe calls :func:`importlib.import_module` (ruff's TID251 refuses it everywhere else), so
that no layer loads another by a name that import-linter cannot see: a name in trainpipe's layers above the
library (the application, the components, the pipelines and DAGs) is refused here; such code imports what it
needs statically, where ``make lint``'s contracts check it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: trainpipe's packages above the library, outermost first (pyproject's import-linter contract names them).
ABOVE_THE_LIBRARY = ("trainpipe.app", "trainpipe.dags", "trainpipe.pipelines", "trainpipe.components")


def import_module(name: str) -> ModuleType:
    """:func:`importlib.import_module`, for names outside trainpipe's layers above the library.

    Raises:
        ImportError: ``name`` lies in the application, a DAG, a pipeline or a component, or cannot be imported.
    """
    above = next((p for p in ABOVE_THE_LIBRARY if name == p or name.startswith(p + ".")), None)
    if above is not None:
        raise ImportError(f"{name} is in {above}, which nothing loads by name (import it where the layers allow)")
    return importlib.import_module(name)  # noqa: TID251 (the one import by name, guarded above)


#: What a composition may import of a component (pyproject's compositions-through-faces contract).
FACES = ("spec", "kfp_component", "airflow_task")


def import_face(component: str, face: str) -> ModuleType:
    """A component's spec or one of its faces, by the component's name: what the DAGs and pipelines may import
    statically, for a component found from its folder (``trainpipe.COMPONENTS``) that no composition names
    (``trainpipe components export`` compiles every one). Nothing else of a component loads by name.

    Raises:
        ImportError: ``face`` is not one of :data:`FACES`, or ``component`` is not a component's name.
    """
    from trainpipe import COMPONENTS

    if face not in FACES or component not in COMPONENTS:
        raise ImportError(f"trainpipe.components.{component}.{face} is not a component's spec or face")
    return importlib.import_module(f"trainpipe.components.{component}.{face}")  # noqa: TID251 (guarded above)
