"""The KFP v2 faces, generated from the components' specs: a face declares only its artifacts and
what the step's result puts on them; its parameters are its spec's settings.

Each ``components/<name>/kfp_component.py`` builds a :class:`Face` and makes the component from it.
The component function is written from the spec: one parameter per setting, with the spec's name,
KFP type and default (:mod:`trainpipe.faces.surface`), its description in the docstring (the KFP UI
shows it), the artifacts, and ``run_id`` (and ``dataset_md5`` for faces that read the snapshot).
Its body, which KFP ships into the container, hands everything to
:func:`~trainpipe.faces.kfp_runtime.run_face`, which starts the step before it imports the face. So a setting
added to a spec is on the face, in the compiled pipeline and in the KFP UI with no other edit, and
a setting the spec lacks is refused where a pipeline passes it (KFP's own check of the call).

Air-gapped clusters cannot ``pip install`` at run time, so components run in the trainpipe image
with kfp already inside (``install_kfp_package=False``); :mod:`trainpipe.services.images` decides which
image runs which component.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfp import dsl
from pydantic import BaseModel

from trainpipe.faces import surface
from trainpipe.faces.kfp_runtime import DATASET_MD5, RUN_ID
from trainpipe.services.images import image_for


@dataclass(frozen=True)
class Artifact:
    """One KFP artifact of a face.

    Attributes:
        name: The parameter's name (what the artifact holds: ``data``, ``model``, ``decision``).
        kind: Its KFP class: Dataset, Model, Artifact, Metrics, HTML or ClassificationMetrics.
        output: An output (the step writes it) or an input.
        field: The spec's path setting it fills (``data``, ``output_dir``); None for an output the
            face fills from the result (metrics, a report).
        optional: An input the step can run without (``= None``).
    """

    name: str
    kind: str
    output: bool = False
    field: str | None = None
    optional: bool = False

    @property
    def annotation(self) -> str:
        return f"{'Output' if self.output else 'Input'}[{self.kind}]"


def In(field: str, kind: str = "Dataset", *, name: str | None = None, optional: bool = False) -> Artifact:  # noqa: N802
    """An input artifact that fills the spec's path setting ``field``."""
    return Artifact(name or field, kind, False, field, optional)


def Out(name: str, kind: str, *, field: str | None = None) -> Artifact:  # noqa: N802
    """An output artifact (``field="output_dir"`` for the step's own output folder)."""
    return Artifact(name, kind, True, field)


@dataclass(frozen=True)
class Face:
    """A component's KFP face.

    Attributes:
        name: The component (folder, entrypoint, function name).
        params: Its settings model (``<Name>Params``): every field is a parameter.
        artifacts: Its artifacts, required ones first.
        doc: The component's description in the KFP UI.
        publish: ``publish(result, artifacts) -> return value``: what the step's result puts on the
            artifacts (metadata, metrics, a copied report) and the task's outputs; runs in the container.
        returns: The function's return annotation as written in its source (``bool``,
            ``NamedTuple(...)``), or "" for none.
        reads_snapshot: The face takes ``dataset_md5`` and checks it names its ``data`` snapshot.
    """

    name: str
    params: type[BaseModel]
    artifacts: Sequence[Artifact]
    doc: str
    publish: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None
    returns: str = ""
    reads_snapshot: bool = False
    _settings: list[surface.KfpParam] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_settings", surface.kfp_params(self.params))

    @property
    def settings(self) -> list[surface.KfpParam]:
        """The face's settings parameters, as the spec derives them."""
        return self._settings

    # --- compile time -----------------------------------------------------------------------------

    def source(self) -> str:
        """The component function's source: the signature from the spec, a body that calls :meth:`run`."""
        required = [a for a in self.artifacts if not a.optional]
        optional = [a for a in self.artifacts if a.optional]
        params = [f"    {a.name}: {a.annotation}," for a in required]
        params += [f"    {p.name}: {p.type.__name__}," for p in self.settings if p.default is surface.REQUIRED]
        params += [
            f"    {p.name}: {p.type.__name__} = {p.default!r},"
            for p in self.settings
            if p.default is not surface.REQUIRED
        ]
        params += [f"    {a.name}: {a.annotation} = None," for a in optional]
        params += [f"    {DATASET_MD5}: str = ''," for _ in range(self.reads_snapshot)]
        params.append(f"    {RUN_ID}: str = '',")
        returns = f" -> {self.returns}" if self.returns else ""
        lines = [f"def {self.name}(", *params, f"){returns}:", f"    {_docstring(self)}", ""]
        lines += [
            "    values = dict(locals())  # the arguments, before a name is bound here",
            "    from trainpipe.faces.kfp_runtime import run_face",
            "",
            f"    return run_face({self.name!r}, values, {self.fields()!r}, {self.unset()!r})",
            "",
        ]
        return "\n".join(lines)

    def function(self) -> Callable[..., Any]:
        """The component function, compiled from :meth:`source` with its source findable (KFP ships it)."""
        source = self.source()
        filename = f"<trainpipe face {self.name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        namespace: dict[str, Any] = {"__name__": f"trainpipe.components.{self.name}.kfp_component"}
        exec("from typing import NamedTuple\nfrom kfp.dsl import *\n", namespace)  # noqa: S102 (the names the source uses)
        exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 (code we generate from the spec)
        return namespace[self.name]

    def component(self, accelerated: bool = False) -> Any:
        """The KFP component, in the component's trainpipe image (its accelerated one when asked).

        Inside a running task (``_KFP_RUNTIME``), where KFP loads only its runtime and the component
        function's body imports this face for :meth:`run`, the plain function: nothing is compiled there."""
        if os.environ.get("_KFP_RUNTIME") == "true":
            return self.function()
        return self.wrap(
            dsl.component(
                self.function(), base_image=image_for(self.name, accelerated=accelerated), install_kfp_package=False
            )
        )

    def wrap(self, comp: Any) -> Any:
        """The KFP component, taking a JSON-text setting (a team's ``train_config``) as a pipeline passes any
        dict: a constant one, or one holding pipeline parameters (:func:`surface.to_kfp_text`). A
        training function's typed config is checked here, at compile time, as far as it is known."""
        face, base = self, type(comp)

        def __call__(component: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            late: dict[str, frozenset[str]] = {}
            for p in face.settings:
                if p.json_text and p.name in kwargs:
                    kwargs[p.name], late[p.name] = surface.to_kfp_text(kwargs[p.name], p.name)
            face.check_train_config(kwargs, late.get("train_config", frozenset()))
            face.check_producers(kwargs)
            task = base.__call__(component, *args, **kwargs)
            task.trainpipe_face = face  # the steps that read its outputs check what they share with it
            return task

        comp.__class__ = type(base.__name__, (base,), {"__call__": __call__, "trainpipe_face": face})
        return comp

    def check_train_config(self, kwargs: dict[str, Any], late: frozenset[str]) -> None:
        """A ``train_config`` against its training function's typed config: a constant key as it is, a key
        holding a pipeline parameter (``late``) by its name and its parameter's type (a ``str`` parameter
        where the model takes a float is refused; its value is the step's to check when KFP fills it);
        raises TypeError, one line, as KFP's own check of a call does."""
        import json

        from trainpipe.contract.errors import InputError
        from trainpipe.training import config_types

        fields = self.params.model_fields
        if "train_function" not in fields or not isinstance(kwargs.get("train_config"), str):
            return
        function = kwargs.get("train_function", fields["train_function"].default)
        try:
            config = json.loads(kwargs["train_config"])
        except ValueError:
            return  # text with a parameter written into it by hand: the step reads it when it runs
        if not isinstance(function, str) or not isinstance(config, dict):
            return
        known = {k: v for k, v in config.items() if k not in late}
        if "{{channel:" in json.dumps(known):
            return
        try:
            config_types.check(function, surface.standins(config), where=f"{self.name} train_config", typed=late)
        except InputError as exc:
            raise TypeError(str(exc)) from None

    def check_producers(self, kwargs: dict[str, Any]) -> None:
        """The settings this step must share with the steps whose outputs it reads (register_model's ``alias``
        and ``model_name`` with the evaluate_model task its ``decision`` comes from), as far as both are
        constants; raises TypeError, one line, as KFP's own check of a call does."""
        from trainpipe.contract.entrypoint import check_same_as_producer, producer_settings
        from trainpipe.contract.errors import InputError

        unknown = object()  # a pipeline parameter or another task's output: known when the task runs

        def given(values: dict[str, Any], params: type[BaseModel]) -> dict[str, Any]:
            plain = {k: v for k, v in values.items() if k in params.model_fields}
            late = {k for k, v in plain.items() if surface.is_channel(v) or "{{channel:" in str(v)}
            return {
                **surface.from_kfp({k: v for k, v in plain.items() if k not in late}, params),
                **dict.fromkeys(late, unknown),
            }

        for artifact in self.artifacts:
            if artifact.output or artifact.field not in producer_settings(self.params):
                continue
            task = getattr(kwargs.get(artifact.name), "task", None)
            producer = getattr(task, "trainpipe_face", None)
            if producer is None:
                continue
            try:
                check_same_as_producer(
                    self.name,
                    self.params,
                    given(kwargs, self.params),
                    artifact.field,
                    producer.name,
                    producer.params,
                    given(getattr(task, "inputs", {}), producer.params),
                    known=lambda value: value is not unknown,
                )
            except InputError as exc:
                raise TypeError(str(exc)) from None

    # --- in the container -------------------------------------------------------------------------

    def fields(self) -> dict[str, str | None]:
        """Each artifact's parameter and the path setting it fills (None: one filled from the result)."""
        return {a.name: a.field for a in self.artifacts}

    def unset(self) -> list[str]:
        """The settings whose KFP stand-in means None (the body reads them without the spec)."""
        return surface.unset_names(self.params, [p.name for p in self.settings])

    def run(self, values: dict[str, Any]) -> Any:
        """What the component function does: the entrypoint with its settings, then :attr:`publish`
        (a body compiled before the body called :func:`~trainpipe.faces.kfp_runtime.run_face` itself)."""
        from trainpipe.faces.kfp_runtime import run_face

        names = [*self.fields(), *(p.name for p in self.settings), RUN_ID, DATASET_MD5]
        return run_face(self.name, {k: values[k] for k in names if k in values}, self.fields(), self.unset())


def _docstring(face: Face) -> str:
    """The docstring KFP reads the component's description and its settings' descriptions from."""
    lines = [face.doc.strip()]
    described = [f"    {p.name}: {p.description}" for p in face.settings if p.description]
    if described:
        lines += ["", "Args:", *described]
    text = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return '"""' + text.replace("\n", "\n    ") + '\n    """'


def accelerated(comp: Any) -> Any:
    """The same component in the image for an accelerator (the GPU image, where it serves it)."""
    func = comp.python_func
    made = dsl.component(func, base_image=image_for(func.__name__, accelerated=True), install_kfp_package=False)
    face = getattr(comp, "trainpipe_face", None)
    return face.wrap(made) if face is not None else made
