"""One parameter surface: a setting's name, type, default and bounds are written once, in the
component's spec, and every face, the pipeline and the DAG agree with it.

- each KFP face takes every setting of its spec under the same name and default (``None`` as the
  type's empty value, :data:`~trainpipe.faces.surface.UNSET`), and nothing else but its artifacts
  and the face-only parameters;
- the pipeline's parameters are the pipeline config's settings, with the config's defaults;
- every setting a pipeline exposes reaches every step that has it (under its own name, or the one
  :data:`~trainpipe.faces.surface.RENAMED` gives), in the compiled pipeline and in the DAG: a step
  never falls back to its own default for something the pipeline was told.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import typing

import pytest

from tests.conftest import REPO
from trainpipe import COMPONENTS
from trainpipe.faces.surface import ARTIFACTS, FACE_ONLY, NOT_FROM_PIPELINE, RENAMED, UNSET, params_model

pytestmark = pytest.mark.contract


def face_function(component: str):
    module = importlib.import_module(f"trainpipe.components.{component}.kfp_component")
    return getattr(module, component).python_func


def face_settings(component: str) -> dict[str, inspect.Parameter]:
    """The KFP face's plain parameters (not artifacts)."""
    return {
        n: p
        for n, p in inspect.signature(face_function(component)).parameters.items()
        if typing.get_origin(p.annotation) is not typing.Annotated
    }


def kfp_type(annotation) -> type:
    """The KFP parameter type a spec field's annotation becomes."""
    args = (
        [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType)
        else [annotation]
    )
    a = args[0]
    origin = typing.get_origin(a) or a
    if origin is typing.Literal:
        return type(typing.get_args(a)[0])
    if isinstance(origin, type) and hasattr(origin, "model_fields"):
        return dict
    return {dict: dict, list: list}.get(origin, origin)


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_kfp_face_takes_its_specs_settings_with_the_same_names_and_defaults(component):
    spec = params_model(component).model_fields
    face = face_settings(component)
    assert set(face) - FACE_ONLY == set(spec), (
        f"face only: {sorted(set(face) - FACE_ONLY - set(spec))}, spec only: {sorted(set(spec) - set(face))}"
    )
    for name, field in spec.items():
        p = face[name]
        default = field.get_default(call_default_factory=True) if not field.is_required() else inspect.Parameter.empty
        if default is None:
            assert p.default == UNSET[p.annotation], (
                f"{component}.{name}: unset is {UNSET[p.annotation]!r} on a KFP face, not {p.default!r}"
            )
        elif hasattr(default, "model_dump"):
            assert p.default == default.model_dump(mode="json"), f"{component}.{name}"
        else:
            assert p.default == default, f"{component}.{name}: face default {p.default!r}, spec default {default!r}"
        assert p.annotation is kfp_type(field.annotation), (
            f"{component}.{name}: face type {p.annotation}, spec {field.annotation}"
        )
    # the spec's path fields are the face's artifacts, named by what they hold
    artifacts = {
        n
        for n, p in inspect.signature(face_function(component)).parameters.items()
        if typing.get_origin(p.annotation) is typing.Annotated
    }
    assert set(ARTIFACTS[component].values()) <= artifacts


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import yaml

    from trainpipe.pipelines.compile import compile_pipeline

    # cpu-smb: every step, optimize_model too
    path = compile_pipeline(tmp_path_factory.mktemp("ir") / "pipeline.yaml", "cpu-smb")
    return next(yaml.safe_load_all(path.read_text()))


def _tasks(ir: dict) -> dict[str, tuple[str, dict]]:
    """Every component task (inside conditions too): task name -> (component, its input parameters)."""
    out = {}

    def walk(dag: dict) -> None:
        for name, task in dag["tasks"].items():
            ref = task["componentRef"]["name"]
            inner = ir["components"][ref]
            if "dag" in inner:
                walk(inner["dag"])
            else:
                out[name] = (name.replace("-", "_"), task.get("inputs", {}).get("parameters", {}))

    walk(ir["root"]["dag"])
    return out


def test_the_pipelines_parameters_are_the_configs_settings_with_its_defaults(compiled, tmp_path):
    from trainpipe.pipelines.config import PipelineConfig, TrainSettings

    cfg = PipelineConfig(data="d.csv").resolved(tmp_path)
    expected = cfg.pipeline_arguments()
    declared = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(declared) == set(expected)
    unset = PipelineConfig(data="d.csv")
    for name, spec in declared.items():
        if "defaultValue" not in spec:
            assert name in ("data", "dvc_repo_dir", "dvc_remote_url", "tracking_uri"), (
                f"{name} has no default but the config gives one"
            )
            continue
        source = unset.train if name in TrainSettings.model_fields else unset
        value = getattr(source, name)
        value = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
        assert spec["defaultValue"] == (
            value if value is not None else expected[name] if expected[name] in UNSET.values() else None
        ), name


def test_every_pipeline_setting_reaches_every_step_that_takes_it(compiled):
    pipeline_params = set(compiled["root"]["inputDefinitions"]["parameters"])
    used = {"data"}  # the importer's
    tasks = _tasks(compiled)
    assert {c for c, _ in tasks.values()} >= set(COMPONENTS)
    for task, (component, bound) in tasks.items():
        if component not in COMPONENTS:
            continue
        for name in params_model(component).model_fields:
            wanted = RENAMED.get((component, name), name)
            if wanted not in pipeline_params or (component, name) in NOT_FROM_PIPELINE:
                continue
            source = bound.get(name, {}).get("componentInputParameter", "")
            assert source.removeprefix("pipelinechannel--") == wanted, (
                f"{task}.{name} does not take the pipeline's {wanted!r} (bound: {bound.get(name)})"
            )
            used.add(wanted)
    assert pipeline_params - used == set(), f"pipeline parameters no step takes: {sorted(pipeline_params - used)}"


DUMP_DAG = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("d", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
tasks = {t.task_id: {"component": getattr(t, "component", None) or getattr(getattr(t, "operator_cls", None), "component", None),
                     "settings": getattr(t, "settings", None)} for t in m.dag.tasks}
print(json.dumps({"params": {k: m.dag.params[k] for k in m.dag.params}, "tasks": tasks}, default=str))
"""


@pytest.mark.parametrize("mode", ["local", "kubernetes"])
@pytest.mark.parametrize("dag_file", ["training_dag.py", "retrain_dag.py"])
def test_every_dag_param_reaches_every_step_that_takes_it(tmp_path, mode, dag_file):
    (tmp_path / "pipeline.yaml").write_text(
        "data: d.csv\noptimize: {enabled: true}\n"
    )  # every step, optimize_model too
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_AIRFLOW_MODE": mode,
        "TRAINPIPE_CONFIG": str(tmp_path / "pipeline.yaml"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", DUMP_DAG, str(REPO / "dags" / dag_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dag = json.loads(proc.stdout.strip().splitlines()[-1])
    params, train, optimize = set(dag["params"]), set(dag["params"]["train"]), set(dag["params"]["optimize"])
    from trainpipe.pipelines.config import NOT_PIPELINE_PARAMETERS, PipelineConfig

    # the DAG's params are the pipeline config's settings (train nested, as in the config file);
    # the retraining DAG starts from a snapshot and takes those of the steps after it
    settings = set(PipelineConfig.model_fields) - set(NOT_PIPELINE_PARAMETERS) | {"workspace", "train", "optimize"}
    assert params == settings if dag_file == "training_dag.py" else params <= settings
    seen = set()
    for task_id, task in dag["tasks"].items():
        component = task["component"]
        if component not in COMPONENTS:
            continue
        seen.add(component)
        settings = task["settings"]
        for name in params_model(component).model_fields:
            wanted = RENAMED.get((component, name), name)
            if (component, name) in NOT_FROM_PIPELINE:
                continue
            if wanted in params and wanted != "train":
                assert settings.get(name, "").replace(" | tojson", "") == "{{ params.%s }}" % wanted, (
                    f"{task_id}.{name}: {settings.get(name)!r}"
                )
            elif component == "train_model" and name in train:
                assert settings.get(name) == "{{ params.train.%s | tojson }}" % name, (
                    f"{task_id}.{name}: {settings.get(name)!r}"
                )
            elif component == "optimize_model" and name in optimize:
                assert settings.get(name) == "{{ params.optimize.%s | tojson }}" % name, (
                    f"{task_id}.{name}: {settings.get(name)!r}"
                )
            elif component == "optimize_model" and name == "seed":  # the pipeline's seed (train.seed)
                assert settings.get(name) == "{{ params.train.seed | tojson }}", (
                    f"{task_id}.{name}: {settings.get(name)!r}"
                )
    assert seen >= {"train_model", "evaluate_model", "optimize_model", "register_model"}
