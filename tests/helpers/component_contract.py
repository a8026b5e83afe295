"""What every component folder's own tests check of its contract, written once: a component's
``tests/test_<name>_component.py`` subclasses :class:`ComponentContract` with its name, beside its own core tests.

- its entrypoint: ``--help`` names every setting and every choice of a closed one; a setting its spec lacks
  is refused in one line with exit 2, an error record and nothing written;
- its faces: the KFP face takes the spec's settings under the same names and defaults; the Airflow operator
  refuses a setting the spec lacks where the DAG is written;
- its folder: ``metadata.yaml`` agrees with the compiled ``component.yaml``; the README's settings table is
  the one generated from the spec.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import typing
from typing import ClassVar

import pytest
import yaml

from tests.conftest import REPO
from trainpipe.contract.entrypoint import input_fields, output_fields
from trainpipe.faces.surface import UNSET
from trainpipe.services.images import image_for


def face_module(component: str):
    return importlib.import_module(f"trainpipe.components.{component}.kfp_component")


def face_function(component: str):
    return getattr(face_module(component), component).python_func


def face_settings(component: str) -> dict[str, inspect.Parameter]:
    """The KFP face's plain parameters (not artifacts)."""
    return {
        n: p
        for n, p in inspect.signature(face_function(component)).parameters.items()
        if typing.get_origin(p.annotation) is not typing.Annotated
    }


def kfp_type(annotation) -> type:
    """The KFP parameter type a spec field's annotation becomes (written again here, on purpose:
    this test checks the generator against its own reading of the rule)."""
    args = (
        [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType)
        else [annotation]
    )
    a = args[0]
    origin = typing.get_origin(a) or a
    if origin is dict and typing.get_args(a)[1:] == (typing.Any,):
        return str  # an open mapping travels as JSON text
    item = (typing.get_args(a) or (None,))[-1]
    if origin in (dict, list) and isinstance(item, type) and hasattr(item, "model_fields"):
        return str  # so do typed records (their numbers keep their types)
    if origin is typing.Literal:
        return type(typing.get_args(a)[0])
    if isinstance(origin, type) and hasattr(origin, "model_fields"):
        return dict
    return {dict: dict, list: list}.get(origin, origin)


def _choices(annotation) -> list[str]:
    """The values of every closed choice inside an annotation (Literal, in a list or optional)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [str(v) for v in typing.get_args(annotation)]
    return [c for a in typing.get_args(annotation) for c in _choices(a)]


def settings_tables():
    """scripts/settings_tables.py, the generator ``make docs`` runs and ``make lint`` checks."""
    spec = importlib.util.spec_from_file_location("settings_tables", REPO / "scripts" / "settings_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_model(component: str):
    """The component's ``<Name>Config``: every setting and artifact path."""
    spec = importlib.import_module(f"trainpipe.components.{component}.spec")
    return getattr(spec, face_module(component).FACE.params.__name__.removesuffix("Params") + "Config")


class ComponentContract:
    """The contract tests a component's folder runs for itself (``name``: the folder's)."""

    name: ClassVar[str]
    pytestmark: ClassVar[list] = [pytest.mark.contract]

    def test_its_kfp_face_takes_its_specs_settings_with_the_same_names_and_defaults(self):
        component = self.name
        face = face_module(component).FACE
        spec = face.params.model_fields
        params = face_settings(component)
        extra = {"run_id"} | ({"dataset_md5"} if face.reads_snapshot else set())
        assert set(params) - extra == set(spec), (
            f"face only: {sorted(set(params) - extra - set(spec))}, spec only: {sorted(set(spec) - set(params))}"
        )
        for name, field in spec.items():
            p = params[name]
            assert p.annotation is kfp_type(field.annotation), (
                f"{component}.{name}: face type {p.annotation}, spec {field.annotation}"
            )
            default = (
                field.get_default(call_default_factory=True) if not field.is_required() else inspect.Parameter.empty
            )
            if default is inspect.Parameter.empty:
                assert p.default is inspect.Parameter.empty, (
                    f"{component}.{name}: required in the spec, not on the face"
                )
            elif default is None:
                assert p.default == UNSET[p.annotation], (
                    f"{component}.{name}: unset is {UNSET[p.annotation]!r} on KFP, not {p.default!r}"
                )
            elif p.annotation is str and kfp_type(field.annotation) is str and not isinstance(default, str):
                from pydantic_core import to_jsonable_python

                assert json.loads(p.default) == to_jsonable_python(default), f"{component}.{name}"
            elif hasattr(default, "model_dump"):
                assert p.default == default.model_dump(mode="json"), f"{component}.{name}"
            else:
                assert p.default == default, f"{component}.{name}: face default {p.default!r}, spec default {default!r}"
        # every artifact fills one of the spec's path settings (or is an output the face fills itself), and
        # every path setting the step cannot run without is an artifact
        config = importlib.import_module(f"trainpipe.components.{component}.spec")
        config = getattr(config, face.params.__name__.removesuffix("Params") + "Config")
        paths = set(input_fields(config)) | set(output_fields(config))
        declared = {a.field for a in face.artifacts if a.field}
        assert declared <= paths and {n for n in paths if config.model_fields[n].is_required()} <= declared, (
            declared,
            paths,
        )

    def test_help_names_every_choice_of_a_closed_setting(self):
        component = self.name
        """``trainpipe <component> --help`` lists the values of every closed setting, read from the spec."""
        proc = subprocess.run(
            [sys.executable, "-m", "trainpipe.app.cli", component, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "COLUMNS": "250"},
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        spec = importlib.import_module(f"trainpipe.components.{component}.spec")
        config = getattr(spec, face_module(component).FACE.params.__name__.removesuffix("Params") + "Config")
        closed = {name: _choices(f.annotation) for name, f in config.model_fields.items() if _choices(f.annotation)}
        for name, values in closed.items():
            flag = "--" + name.replace("_", "-")
            assert f"{flag} " + "{" + "|".join(values) + "}" in proc.stdout or f"{flag} [" + "{" in proc.stdout, (
                name,
                values,
            )
        if component == "train_model":
            assert (
                "--task {classification|regression}" in proc.stdout
                and "{torch_ddp|torch_fsdp|horovod|tensorflow}" in proc.stdout
            )

    def test_its_metadata_agrees_with_its_compiled_component_spec(self):
        folder = REPO / "components" / self.name
        meta = yaml.safe_load((folder / "metadata.yaml").read_text())
        spec = yaml.safe_load((folder / "component.yaml").read_text())
        name = folder.name
        assert meta["name"] == name and meta["entrypoint"] == f"python -m trainpipe.components.{name}"
        executors = spec["deploymentSpec"]["executors"]
        (executor,) = executors.values()
        assert meta["image"] == executor["container"]["image"] == image_for(name), (
            meta["image"],
            executor["container"]["image"],
        )
        accelerated = image_for(name, accelerated=True)
        assert meta.get("accelerated_image", meta["image"]) == accelerated
        assert set(meta) <= {
            "name",
            "stability",
            "entrypoint",
            "image",
            "accelerated_image",
            "external_services",
            "description",
        }

    def test_a_setting_its_spec_lacks_is_refused_in_one_line_with_an_error_record(self, tmp_path):
        config = config_model(self.name)
        paths = set(input_fields(config)) | set(output_fields(config))
        required = {
            n: str(tmp_path / n) if n in paths else "x" for n, f in config.model_fields.items() if f.is_required()
        }
        settings = tmp_path / "settings.json"
        settings.write_text(json.dumps({**required, "no_such_setting": 1}))
        record = tmp_path / "error.json"
        proc = subprocess.run(
            [sys.executable, "-m", f"trainpipe.components.{self.name}", "--config", str(settings)]
            + ["--error-record", str(record)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith(f"trainpipe {self.name}: error: ")]
        assert len(errors) == 1 and "no_such_setting" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
        assert json.loads(record.read_text()) == {
            "component": self.name,
            "exit_code": 2,
            "message": errors[0].removeprefix(f"trainpipe {self.name}: error: "),
        }
        assert not any((tmp_path / n).exists() for n in output_fields(config)), "an output was begun"

    def test_its_airflow_operator_refuses_a_setting_its_spec_lacks_where_the_dag_is_written(self):
        module = importlib.import_module(f"trainpipe.components.{self.name}.airflow_task")
        (operator,) = [
            v for v in vars(module).values() if inspect.isclass(v) and getattr(v, "component", None) == self.name
        ]
        assert operator.__name__ == "".join(p.title() for p in self.name.split("_")) + "Operator"
        assert operator.config is config_model(self.name)
        with pytest.raises(TypeError, match=f"'no_such_setting' is not a setting of {self.name}"):
            operator(task_id="t", settings={"no_such_setting": 1})

    def test_its_readme_table_is_the_one_generated_from_its_spec(self):
        tables = settings_tables()
        readme = (REPO / "components" / self.name / "README.md").read_text(encoding="utf-8")
        assert tables.undescribed(self.name) == [], "every setting and result field says what it is"
        assert tables.with_tables(readme, tables.tables(self.name)) == readme, "run `make docs`"
        for field in config_model(self.name).model_fields:
            assert f"| `{field}` |" in readme
