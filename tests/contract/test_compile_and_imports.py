"""Contract tier: the KFP compile, DagBag load, import hygiene, operator construction."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.contract

HEAVY = ("torch", "tensorflow", "horovod", "great_expectations", "dvc", "mlflow")


@pytest.mark.parametrize(
    "target",
    [
        "import trainpipe",
        "import trainpipe.pipelines.training_pipeline",
        "LOAD:dags/training_dag.py",
        "import trainpipe.app.cli",
        # the train_model launcher and the cluster-job builder start ranks; they load no framework
        "import trainpipe.components.train_model.core, trainpipe.components.train_model.k8s",
    ],
)
def test_import_loads_no_heavy_library(target, tmp_path):
    if target.startswith("LOAD:"):
        code = (
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('d', {str(REPO / target[5:])!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        )
    else:
        code = target + "\n"
    code += f"import sys; print('heavy=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    (tmp_path / "pipeline.yaml").write_text(f"data: {tmp_path / 'data.csv'}\n")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_CONFIG": str(tmp_path / "pipeline.yaml"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "heavy=", f"{target} loaded {proc.stdout.strip()}"


def test_trainpipe_component_starts_as_its_entrypoint_without_loading_the_cli():
    """`trainpipe <component>` costs what `python -m trainpipe.components.<component>` costs: it becomes the
    entrypoint before the CLI (typer, its commands) is loaded, rather than loading the CLI to start the
    entrypoint in a child (the child's start-up came on top of the CLI's)."""
    cli = os.path.join(os.path.dirname(sys.executable), "trainpipe")
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # every module either process loads, on stderr
    proc = subprocess.run(
        [cli, "validate_data", "--help"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m trainpipe.components.validate_data")
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "trainpipe.components.validate_data.core" in loaded
    cli_modules = loaded & {"typer", "click", "trainpipe.app.cli"}
    assert not cli_modules, f"the CLI was loaded on the way: {sorted(cli_modules)}"


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("trainpipe.training.torch.context", ("tensorflow", "horovod")),
        ("trainpipe.training.tf.context", ("torch", "horovod")),
        ("trainpipe.training.tf.builtin", ("torch", "horovod")),
        # the driver, the data layer, the rank entrypoint and the launcher load no framework until a rank makes its
        # context
        (
            "trainpipe.training.loop, trainpipe.training.data, trainpipe.training.worker, trainpipe.training.launch, "
            "trainpipe.training.builtin",
            ("torch", "tensorflow", "horovod"),
        ),
    ],
)
def test_each_backend_module_imports_only_its_framework(module, forbidden):
    code = f"import {module}, sys; print('loaded=' + ','.join(m for m in {forbidden!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "loaded=", f"{module} loaded {proc.stdout.strip()}"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from trainpipe.pipelines.compile import compile_pipeline

    out = {}
    for profile in ("cpu", "gpu", "cpu-smb"):
        path = compile_pipeline(tmp_path_factory.mktemp(profile) / "p.yaml", profile)
        out[profile] = list(yaml.safe_load_all(path.read_text()))
    return out


def test_every_task_has_retry_and_resources(compiled):
    spec = compiled["cpu"][0]
    executors = spec["deploymentSpec"]["executors"]
    tasks = dict(spec["root"]["dag"]["tasks"])
    for t in spec["components"].values():
        tasks.update(t.get("dag", {}).get("tasks", {}))
    component_tasks = {n: t for n, t in tasks.items() if not n.startswith(("importer", "condition"))}
    assert set(component_tasks) == {
        "validate-data",
        "snapshot-dataset",
        "detect-drift",
        "train-model",
        "profile-training",
        "evaluate-model",
        "register-model",
    }
    for name, task in component_tasks.items():
        policy = task.get("retryPolicy")
        assert policy and policy["maxRetryCount"] >= 1 and policy["backoffFactor"] == 2, name
        assert policy["backoffMaxDuration"] == "600s", name
        exe = executors[spec["components"][task["componentRef"]["name"]]["executorLabel"]]
        res = exe["container"]["resources"]
        assert res["cpuLimit"] > 0 and res["memoryLimit"] > 0, name
        assert "pip install" not in " ".join(exe["container"]["command"]), name


def test_drift_and_the_gate_are_conditions(compiled):
    """detect_drift's output decides whether the model steps run; inside, the gate decides registration."""
    spec = compiled["cpu"][0]
    retrain = spec["root"]["dag"]["tasks"]["condition-1"]
    assert "detect-drift" in retrain["triggerPolicy"]["condition"] and "detect-drift" in retrain["dependentTasks"]
    inner = spec["components"]["comp-condition-1"]["dag"]["tasks"]
    assert {"train-model", "evaluate-model", "profile-training", "condition-2"} <= set(inner)
    assert "evaluate-model" in inner["condition-2"]["triggerPolicy"]["condition"]
    assert "register-model" in spec["components"]["comp-condition-2"]["dag"]["tasks"]


def test_the_cpu_smb_profile_optimizes_between_the_gate_and_register(compiled, tmp_path):
    """optimize_model runs only when the gate passed, and register_model takes its variant; the cpu
    profile (the demo's) has neither; a config's optimize.enabled overrides the profile."""
    spec = compiled["cpu-smb"][0]
    validate_pipeline_yaml_dict(compiled["cpu-smb"], tmp_path)
    gated = spec["components"]["comp-condition-2"]["dag"]["tasks"]
    assert set(gated) == {"optimize-model", "register-model"}
    register = gated["register-model"]
    assert register["dependentTasks"] == ["optimize-model"]
    assert register["inputs"]["artifacts"]["optimized"] == {
        "taskOutputArtifact": {"outputArtifactKey": "optimized", "producerTask": "optimize-model"}
    }
    optimize = gated["optimize-model"]["inputs"]["parameters"]
    assert optimize["seed"] == {"componentInputParameter": "pipelinechannel--seed"}
    assert optimize["max_metric_drop"]["runtimeValue"]["constant"] == 0.005
    res = spec["deploymentSpec"]["executors"]["exec-optimize-model"]["container"]["resources"]
    assert res["cpuLimit"] == 1 and res["memoryLimit"] == 2  # the small server's step resources
    assert "optimize-model" not in yaml.safe_dump(compiled["cpu"])
    from trainpipe.pipelines.config import PipelineConfig

    off = PipelineConfig(data="d.csv", profile="cpu-smb", optimize={"enabled": False})
    on = PipelineConfig(data="d.csv", optimize={"enabled": True, "variants": ["int8_static"]})
    assert off.optimize_settings() is None and on.optimize_settings()["variants"] == ["int8_static"]
    assert PipelineConfig(data="d.csv", profile="cpu-smb").optimizes() and not PipelineConfig(data="d.csv").optimizes()


def validate_pipeline_yaml_dict(docs: list, tmp_path) -> None:
    from trainpipe.pipelines.compile import validate_pipeline_yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    validate_pipeline_yaml(path)


def test_gpu_profile_requests_gpus_for_training_only(compiled):
    spec = compiled["gpu"][0]
    execs = spec["deploymentSpec"]["executors"]
    train = execs["exec-train-model"]["container"]["resources"]
    assert train["accelerator"]["resourceType"] == "nvidia.com/gpu" and int(train["accelerator"]["resourceCount"]) == 1
    assert "accelerator" not in execs["exec-validate-data"]["container"]["resources"]
    platform = compiled["gpu"][1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert platform["exec-train-model"]["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}


def test_compiled_yaml_holds_no_local_paths_or_secrets(compiled):
    text = yaml.safe_dump(compiled["cpu"])
    assert "MLFLOW_TRACKING_PASSWORD" not in text and "/work/" not in text


def test_cli_compile(tmp_path):
    out = tmp_path / "p.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load_all(out.read_text())
    bad = subprocess.run(
        [sys.executable, "-m", "trainpipe.app.cli", "compile", "--profile", "tpu", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown profile 'tpu'" in bad.stderr and "Traceback" not in bad.stderr


def test_dagbag_loads_without_errors_and_every_task_has_retries_and_timeout(tmp_path, monkeypatch):
    (tmp_path / "pipeline.yaml").write_text(f"data: {tmp_path / 'data.csv'}\n")
    monkeypatch.setenv("TRAINPIPE_CONFIG", str(tmp_path / "pipeline.yaml"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag({str(REPO / 'dags')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "dag = bag.dags['trainpipe_training']\n"
        "ids = sorted(t.task_id for t in dag.tasks)\n"
        "print(ids)\n"
        "for t in dag.tasks:\n"
        "    assert t.execution_timeout is not None, t.task_id\n"
        "    if t.task_id not in ('validate_data', 'gate', 'retrain'):\n"
        "        assert t.retries >= 1 and t.retry_exponential_backoff, t.task_id\n"
        "assert dag.doc_md\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "register_model" in proc.stdout and "gate" in proc.stdout and "detect_drift" in proc.stdout


def test_kubernetes_mode_builds_pod_operators(tmp_path):
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('d', {str(REPO / 'dags/training_dag.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "t = m.dag.get_task('train_model')\n"
        "print(type(t).__mro__[1].__name__, t.cmds, t.image)\n"
        "assert '--result' in t.arguments and '/airflow/xcom/return.json' in t.arguments\n"
    )
    (tmp_path / "pipeline.yaml").write_text(f"data: {tmp_path / 'data.csv'}\n")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "TRAINPIPE_CONFIG": str(tmp_path / "pipeline.yaml"),
        "TRAINPIPE_AIRFLOW_MODE": "kubernetes",
        "TRAINPIPE_IMAGE": "registry.example/trainpipe:1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "KubernetesPodOperator ['python', '-m', 'trainpipe.components.train_model'] registry.example/trainpipe:1"
        in proc.stdout
    )


def test_every_component_ships_in_the_distribution():
    """pyproject lists each component's package and its data: a component left out installs nowhere
    but this checkout (an image, a wheel, a team's venv would lack it)."""
    import tomllib

    from tests.conftest import REPO
    from trainpipe import COMPONENTS

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for name in COMPONENTS:
        assert f"trainpipe.components.{name}" in setuptools["packages"], name
        assert setuptools["package-data"][f"trainpipe.components.{name}"] == ["*.yaml", "*.md"], name


def test_every_package_folder_ships_in_the_distribution_and_the_contracts():
    """Every folder of Python modules under the folders pyproject maps into ``trainpipe`` (a component's
    subpackage included) is a package pyproject lists: one left out is silently missing from the wheel, and
    from the import-linter contracts, which ``make lint`` checks on the installed package. Test folders
    (``tests/``) stay out of the wheel."""
    import tomllib

    from tests.conftest import REPO

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, found = set(setuptools["packages"]), set()
    for package, folder in setuptools["package-dir"].items():
        root = REPO / folder
        for path in root.rglob("*.py"):
            parts = path.parent.relative_to(root).parts
            if {"tests", "__pycache__", "golden"} & set(parts):
                continue
            found.add(".".join([package, *parts]))
            assert (path.parent / "__init__.py").is_file(), f"{path.parent.relative_to(REPO)} has no __init__.py"
    assert found - listed == set(), f"folders of modules that pyproject's packages leave out: {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject lists packages that hold no module: {sorted(listed - found)}"


TEAM_TRAIN = {
    "train_function": "teampkg.typed:train",
    "train_config": {"learning_rate": 0.01, "hidden": [16]},
    "epochs": 1,
    "nproc_per_node": 1,
}


@pytest.fixture
def team_config(tmp_path, monkeypatch):
    """What a new team writes from the docs: its typed function, a priced profile file beside the config, and a
    tune section that searches a key of the function's own config, repeats the train section in full, and has
    the README's two objectives, one of them the cost. Read from another folder, as ``trainpipe run`` does."""
    from trainpipe.pipelines.config import load_pipeline_config
    from trainpipe.training import config_types

    monkeypatch.syspath_prepend(str(REPO / "tests" / "fixtures"))
    config_types.config_model.cache_clear()
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "priced.yaml").write_text(
        "name: team-cpu-priced\nprices: {currency: EUR, cpu_core_hour: 0.05, node_hour: 0.1}\n"
        "secrets_as_env: {mlflow-creds: {password: MLFLOW_TRACKING_PASSWORD}}\n"
    )
    tune = {
        "workers": 2,
        "objectives": [{"metric": "val_loss", "direction": "minimize"}, {"metric": "cost"}],
        "space": {"train_config.eps": {"type": "float", "low": 1e-08, "high": 1e-06, "log": True}},
        "train": TEAM_TRAIN,
    }
    path = folder / "pipeline.yaml"
    config = {
        "data": "raw.csv",
        "profile": "priced.yaml",
        "train": TEAM_TRAIN,
        "tune": tune,
        "optimize": {"enabled": True},
    }
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    return path, load_pipeline_config(path)


def _carries_the_priced_profile(value: str) -> None:
    import json

    profile = json.loads(value)
    assert profile["name"] == "team-cpu-priced" and profile["prices"]["currency"] == "EUR", value
    assert "MLFLOW_TRACKING_PASSWORD" not in value  # a profile travels without the names of its secrets


def test_the_compiled_pipeline_gives_the_profile_file_and_the_team_function_to_the_steps_that_use_them(
    team_config, tmp_path
):
    """Issue 44: the KFP pipeline told train_model the profile's name (its prices were lost in the pod), and a
    tune section repeating the train section, or optimize_model, failed to compile with a team's function
    (trusted_packages passed twice)."""
    import json

    from trainpipe.pipelines.compile import compile_pipeline

    _, cfg = team_config
    out = compile_pipeline(
        tmp_path / "p.yaml",
        cfg.profile,
        trusted_code=cfg.trusted_code(),
        tune=cfg.tune_settings(),
        optimize=cfg.optimize,
    )
    spec = next(yaml.safe_load_all(out.read_text()))
    executors = spec["deploymentSpec"]["executors"]
    tasks = {}
    for comp in [spec["root"], *spec["components"].values()]:
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    tune_tasks = [t for name, t in tasks.items() if name.startswith("tune-model")]
    assert len(tune_tasks) == 2  # the workers (a ParallelFor) and the summary

    def env(task: dict) -> dict:
        container = executors[spec["components"][task["componentRef"]["name"]]["executorLabel"]]["container"]
        return {e["name"]: e["value"] for e in container.get("env", [])}

    for task in [tasks["train-model"], tasks["profile-training"], *tune_tasks]:  # PROFILE_STEPS
        _carries_the_priced_profile(env(task)["TRAINPIPE_HARDWARE_PROFILE"])
    assert "TRAINPIPE_HARDWARE_PROFILE" not in env(tasks["evaluate-model"])  # it reads none

    def given(task: dict) -> dict:
        return {
            k: v["runtimeValue"]["constant"] for k, v in task["inputs"]["parameters"].items() if "runtimeValue" in v
        }

    for task in [*tune_tasks, tasks["optimize-model"]]:  # the team's package trusted once (it was passed twice)
        assert given(task)["trusted_packages"] == ["teampkg"]
    for task in tune_tasks:
        assert json.loads(given(task)["train"])["train_function"] == "teampkg.typed:train"
        assert "pruner" not in given(task)  # unset: none for the two objectives, as Optuna allows
        # the study's budget is the tune section's own: train's max_cost (each training's) was bound to it
        for budget in ("max_cost", "max_gpu_hours"):
            assert task["inputs"]["parameters"].get(budget, {}).get("componentInputParameter") is None, budget


def _env_of(task) -> dict:
    """A task's environment: a local operator's ``env``, a pod's ``env_vars``, a mapped task's partial ones."""
    if hasattr(task, "partial_kwargs"):
        return dict(task.partial_kwargs.get("env") or {})
    if hasattr(task, "env_vars"):
        return {e.name: e.value for e in task.env_vars}
    return dict(task.env)


@pytest.mark.parametrize("mode", ["local", "kubernetes"])
def test_the_dags_give_the_profile_file_and_the_team_function_to_the_steps_that_use_them(
    team_config, monkeypatch, mode
):
    """The same on Airflow, in both modes: the DAG's train_model and tune_model tasks (the mapped workers too)
    carry the profile's content (the DAG set none, so a step ran as ``local``, unpriced), and tune_model's
    settings name the team's function and trust its package."""
    from datetime import datetime

    from airflow.sdk import DAG

    from trainpipe.pipelines import graph
    from trainpipe.pipelines.dag_topology import DagSettings, render, switches

    path, _ = team_config
    monkeypatch.setenv("TRAINPIPE_CONFIG", str(path))
    monkeypatch.setenv("TRAINPIPE_AIRFLOW_MODE", mode)
    settings = DagSettings()
    with DAG(dag_id=f"team_{mode}", schedule=None, start_date=datetime(2026, 1, 1), params=settings.params()) as dag:
        tune = settings.config.tune_settings()
        chosen = graph.steps(switches(tune=tune), "airflow", start="tune_model")
        render(settings.step, chosen, snapshot_dir="/s", run_dir="/r", tune=tune, mapped=settings.mapped)
    tune_ids = [t for t in dag.task_dict if t.startswith("tune_model")]
    assert len(tune_ids) == (2 if mode == "local" else 3)  # workers mapped, or one pod task each; the summary
    for task_id in ["train_model", "profile_training", *tune_ids]:  # PROFILE_STEPS
        _carries_the_priced_profile(_env_of(dag.task_dict[task_id])["TRAINPIPE_HARDWARE_PROFILE"])
    assert "TRAINPIPE_HARDWARE_PROFILE" not in _env_of(dag.task_dict["evaluate_model"])  # it reads none
    if mode == "local":
        tune = dag.task_dict["tune_model"].settings
        assert tune["trusted_packages"] == ["teampkg"] and tune["train"]["train_function"] == "teampkg.typed:train"
        assert "max_cost" not in tune and "max_gpu_hours" not in tune  # train's budget is each training's
