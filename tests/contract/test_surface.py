"""One parameter surface: a setting's name, type, default and bounds are written once, in the
component's spec, and every face, the pipeline and the DAG are derived from it.

- each KFP face takes every setting of its spec under the same name and default (``None`` as the
  type's empty value, :data:`~trainpipe.faces.surface.UNSET`; an open mapping as JSON text), and
  nothing else but its artifacts, ``run_id`` and (where it reads the snapshot) ``dataset_md5``;
- the pipeline's parameters are the pipeline config's settings, with the config's defaults;
- every setting a pipeline exposes reaches every step that has it (under its own name, or the one
  :data:`~trainpipe.pipelines.config.RENAMED` gives), in the compiled pipeline and in the DAG: a
  step never falls back to its own default for something the pipeline was told;
- a setting added to a spec reaches the KFP YAML, the Airflow operator and ``--help`` with no other
  edit, and a setting the spec lacks fails where it is written (DAG import, KFP compile).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers.component_contract import face_module
from trainpipe import COMPONENTS
from trainpipe.faces.surface import UNSET
from trainpipe.pipelines import graph
from trainpipe.pipelines.config import NOT_FROM_PIPELINE, RENAMED

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import yaml

    from trainpipe.pipelines.compile import compile_pipeline

    # cpu-smb: every step, optimize_model too; and tune_model first
    tune = {
        "space": {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
        "storage": "postgresql+psycopg2://tune@db/tune",
        "workers": 2,
    }
    path = compile_pipeline(tmp_path_factory.mktemp("ir") / "pipeline.yaml", "cpu-smb", tune=tune)
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
        if spec["parameterType"] == "STRING" and not isinstance(value, str) and value is not None:
            value = json.dumps(value)  # an open mapping travels as JSON text (its numbers keep their types)
        assert spec["defaultValue"] == (
            value if value is not None else expected[name] if expected[name] in UNSET.values() else None
        ), name


def test_every_pipeline_setting_reaches_every_step_that_takes_it(compiled):
    pipeline_params = set(compiled["root"]["inputDefinitions"]["parameters"])
    used = {"data"}  # the importer's
    tasks = _tasks(compiled)
    # the reference pipeline's steps are its tasks (cpu-smb with tune: every one KFP renders); a component it does
    # not run (a team's, a new one) is a component all the same
    assert {c for c, _ in tasks.values()} >= {s.name for s in graph.STEPS if "kfp" in s.engines}
    for task, (component, bound) in tasks.items():
        if component not in COMPONENTS:
            continue
        for name in face_module(component).FACE.params.model_fields:
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
tasks = {t.task_id: {"component": getattr(t, "component", None) or getattr(getattr(t, "operator_cls", None),
"component", None),
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
        for name in face_module(component).FACE.params.model_fields:
            wanted = RENAMED.get((component, name), name)
            if (component, name) in NOT_FROM_PIPELINE:
                continue
            # a nested param's setting falls back to the config's value (a run's override names only some)
            got = re.sub(r" \| default\(.*\)", "", settings.get(name, "").replace(" | tojson", ""))
            if wanted in params and wanted not in ("train", "optimize"):
                assert got == "{{ params." + wanted + " }}", f"{task_id}.{name}: {settings.get(name)!r}"
            elif wanted in train and "train" in params:
                assert got == "{{ params.train." + wanted + " }}", f"{task_id}.{name}: {settings.get(name)!r}"
            elif component == "optimize_model" and name in optimize:
                assert got == "{{ params.optimize." + name + " }}", f"{task_id}.{name}: {settings.get(name)!r}"
    assert seen >= {"train_model", "evaluate_model", "optimize_model", "register_model"}


#: The one edit: a new setting in train_model's settings (the library's training settings type).
NEW_SETTING = '    newcomer_setting: int = Field(7, ge=0, description="a setting added in one place")\n'
PROBE_NEW_SETTING = """
import contextlib, io, json, sys, importlib.util
import yaml
from trainpipe.pipelines.compile import compile_pipeline
ir = next(yaml.safe_load_all(compile_pipeline(sys.argv[1] + "/p.yaml", "cpu").read_text()))
inner = next(c["dag"]["tasks"]["train-model"] for c in [ir["root"], *ir["components"].values()]
             if "train-model" in c.get("dag", {}).get("tasks", {}))
spec = importlib.util.spec_from_file_location("d", sys.argv[2])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
from trainpipe.contract.entrypoint import make_parser
from trainpipe.components.train_model.spec import TrainModelConfig
help_text = make_parser("train_model", TrainModelConfig, "").format_help()
print(json.dumps({
    "pipeline": ir["root"]["inputDefinitions"]["parameters"].get("newcomer_setting"),
    "face": ir["components"]["comp-train-model"]["inputDefinitions"]["parameters"].get("newcomer_setting"),
    "bound": inner["inputs"]["parameters"].get("newcomer_setting"),
    "dag_param": m.dag.params["train"].get("newcomer_setting"),
    "operator": m.dag.get_task("train_model").settings.get("newcomer_setting"),
    "help": "--newcomer-setting" in help_text,
}))
"""


def test_a_setting_added_to_a_spec_reaches_every_face_with_no_other_edit(tmp_path):
    """The package copied as it installs, one line added to the settings: the KFP face and the compiled
    pipeline take it (bound to a pipeline parameter), the training DAG passes it from its params, and
    ``--help`` lists it."""
    pkg = tmp_path / "site" / "trainpipe"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "src" / "trainpipe", pkg, ignore=skip)
    for part in ("components", "pipelines", "dags"):
        shutil.copytree(REPO / part, pkg / part, ignore=skip)
    settings = pkg / "training" / "settings.py"
    anchor = "    keep_checkpoints: int = Field("
    assert anchor in settings.read_text()
    settings.write_text(settings.read_text().replace(anchor, NEW_SETTING + anchor, 1))
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    (tmp_path / "dag.yaml").write_text(f"data: {tmp_path / 'data.csv'}\n")
    env["TRAINPIPE_CONFIG"] = str(tmp_path / "dag.yaml")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_NEW_SETTING, str(tmp_path), str(pkg / "dags" / "training_dag.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["pipeline"] == {
        "defaultValue": 7,
        "description": "a setting added in one place",
        "isOptional": True,
        "parameterType": "NUMBER_INTEGER",
    }, got
    assert got["face"]["defaultValue"] == 7 and got["bound"] == {
        "componentInputParameter": "pipelinechannel--newcomer_setting"
    }
    assert got["dag_param"] == 7 and got["operator"] == "{{ params.train.newcomer_setting | default(7) | tojson }}"
    assert got["help"]


UNKNOWN_IN_DAG = """
from datetime import datetime
from airflow.sdk import DAG
from trainpipe.components.train_model.airflow_task import TrainModelOperator
with DAG(dag_id="typo", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    TrainModelOperator(task_id="train_model", settings={"data": "d", "output_dir": "o", "hidden_units": [64]})
"""


def test_a_setting_the_spec_lacks_fails_where_it_is_written(tmp_path):
    """``hidden_units`` is a train_config key, not a setting: the DAG file does not import, and a
    pipeline that passes it does not compile, each naming it."""
    dag = tmp_path / "typo_dag.py"
    dag.write_text(UNKNOWN_IN_DAG)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run([sys.executable, str(dag)], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 1
    assert "TypeError: TrainModelOperator: 'hidden_units' is not a setting of train_model" in proc.stderr
    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    with pytest.raises(TypeError, match="setting 'epochs': Input should be a valid integer"):
        TrainModelOperator.check_settings({"epochs": "ten"})
    TrainModelOperator.check_settings(
        {"epochs": "{{ params.train.epochs | tojson }}"}
    )  # a template: checked when rendered

    from kfp import dsl

    from trainpipe.components.train_model.kfp_component import train_model

    def typo(data: str):
        raw = dsl.importer(artifact_uri=data, artifact_class=dsl.Dataset)
        train_model(data=raw.output, hidden_units=[64])

    typo.__annotations__ = {"data": str}  # this module's annotations are strings; KFP reads the types
    with pytest.raises(TypeError, match="hidden_units"):
        dsl.pipeline(name="typo")(typo)
