"""The renderings of the reference pipeline against its one declaration (trainpipe.pipelines.graph): the compiled
KFP YAML's tasks, the artifacts and values each takes from which task, and the conditions it runs under; the
DAGs' tasks, edges and trigger rules. Pure data: nothing runs, and the KFP side reads the golden files (which
test_golden holds to a fresh compile) and one compile with every optional step on."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from trainpipe.pipelines import graph

pytestmark = pytest.mark.contract

TEAM = "teampkg"
SPACE = {"train_config.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}}


def _kfp(name: str) -> str:
    return name.replace("_", "-")


def _resolve(spec: dict[str, Any], scope: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """A task's inputs that come from another task, as (producer, output), through the conditions' channels."""
    out = {}
    for kind in ("artifacts", "parameters"):
        for name, ref in spec.get("inputs", {}).get(kind, {}).items():
            for key in ("taskOutputArtifact", "taskOutputParameter"):
                if key in ref:
                    produced = ref[key]
                    out[name] = (
                        produced["producerTask"],
                        produced.get("outputArtifactKey") or produced["outputParameterKey"],
                    )
            channel = ref.get("componentInputArtifact") or ref.get("componentInputParameter")
            if channel in scope:
                out[name] = scope[channel]
    return out


def compiled_graph(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each executed task of a compiled pipeline: its inputs from other tasks, the conditions around it (name and
    deciding task), its caching; a ParallelFor's tasks by their own names."""
    components = spec["components"]
    found: dict[str, dict[str, Any]] = {}

    def walk(dag: dict[str, Any], scope: dict[str, tuple[str, str]], conds: tuple[tuple[str, str], ...]) -> None:
        for name, task in dag["tasks"].items():
            inputs = _resolve(task, scope)
            inner = components[task["componentRef"]["name"]].get("dag")
            if inner is None:
                found[name] = {
                    "inputs": inputs,
                    "when": conds,
                    "cached": task.get("cachingOptions", {}).get("enableCache", False),
                }
                continue
            condition = task.get("triggerPolicy", {}).get("condition")
            here = conds
            if condition is not None:
                channel = condition.split("['", 1)[1].split("']", 1)[0]
                # a condition runs its steps when its decision is true: nothing compared, nothing negated
                truth = f"inputs.parameter_values['{channel}']"
                assert condition in (truth, f"{truth} == true"), f"{name}: condition {condition!r}"
                here = (*conds, (task["taskInfo"]["name"], inputs[channel][0]))
            walk(inner, inputs, here)

    walk(spec["root"]["dag"], {}, ())
    return found


def declared_kfp(switches: list[str]) -> dict[str, dict[str, Any]]:
    """What the declaration says the compiled pipeline holds, in :func:`compiled_graph`'s terms."""
    chosen = graph.steps(switches, "kfp")
    names = {s.name: _kfp(s.name) for s in chosen}
    for s in chosen:
        if s.fan_out:  # the workers keep the name, the summary is the second task of the component
            names[s.name] = f"{_kfp(s.name)}-2"
    out = {"importer": {"inputs": {}, "when": (), "cached": True}}
    for s in chosen:
        inputs = {
            k: ("importer", "artifact") if v == graph.RAW else (names[v.partition(".")[0]], v.partition(".")[2])
            for k, v in s.takes.items()
        }
        when = tuple((c, names[graph.CONDITIONS[c].decided_by]) for c in s.when)
        out[names[s.name]] = {"inputs": inputs, "when": when, "cached": s.cached}
        if s.fan_out:
            out[_kfp(s.name)] = {"inputs": inputs, "when": when, "cached": s.cached}
    return out


def _compare_kfp(spec: dict[str, Any], switches: list[str]) -> None:
    got, want = compiled_graph(spec), declared_kfp(switches)
    assert sorted(got) == sorted(want), "the compiled pipeline's tasks are not the declared steps"
    for name, task in want.items():
        assert got[name] == task, f"{name}: compiled {got[name]}, declared {task}"


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_golden_pipelines_are_the_declared_graph(profile):
    spec = next(yaml.safe_load_all((REPO / "pipelines" / "golden" / f"pipeline-{profile}.yaml").read_text()))
    _compare_kfp(spec, graph.switches(tune=False, profile=True, optimize=False, approval=False))


def test_the_pipeline_with_every_optional_step_is_the_declared_graph(tmp_path):
    from kfp import compiler

    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.services.profiles import PROFILES

    tune = {"space": SPACE, "storage": "sqlite:///s.db", "trusted_packages": [TEAM], "workers": 2}
    pipeline = build_pipeline(PROFILES["cpu"], trusted_code=TEAM, optimize={}, require_approval=True, tune=tune)
    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, package_path=str(out))
    _compare_kfp(next(yaml.safe_load_all(out.read_text())), ["tune", "profile", "optimize", "approval"])


def test_each_declared_input_is_an_output_of_its_producers_component():
    """Airflow passes a producer's output folder whatever the output's name; KFP needs the name: a misspelt one
    fails here, not as a bare KeyError in the compile."""
    import importlib

    for s in graph.STEPS:
        for key, ref in s.takes.items():
            if ref == graph.RAW:
                continue
            producer, _, output = ref.partition(".")
            face = importlib.import_module(f"trainpipe.components.{producer}.kfp_component")
            outputs = getattr(face, producer).component_spec.outputs or {}
            assert output in outputs, f"{s.name} takes {key} from {ref}: {producer} has {sorted(outputs)}"


def _without(name: str, **changes: Any) -> tuple[graph.Step, ...]:
    """The declaration with one step changed."""
    from dataclasses import replace

    return tuple(replace(s, **changes) if s.name == name else s for s in graph.STEPS)


def _moved(name: str, before: str) -> tuple[graph.Step, ...]:
    rest = [s for s in graph.STEPS if s.name != name]
    i = [s.name for s in rest].index(before)
    return (*rest[:i], graph.BY_NAME[name], *rest[i:])


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        (_without("evaluate_model", takes={"model": "train_modle.model"}), "no declared step is named 'train_modle'"),
        (_without("profile_training", optional="profiel"), "optional on 'profiel': no such switch"),
        (_without("profile_training", when=("gate_passed",)), "runs when 'gate_passed': no such condition"),
        (_without("optimize_model", when=("gate-passed", "retrain")), "inner first: write (retrain, gate-passed)"),
        (_without("optimize_model", after=("nope",)), "optimize_model follows 'nope': no declared step"),
        ((*graph.STEPS, graph.BY_NAME["approve"]), "approve is declared twice"),
        (_moved("profile_training", "register_model"), "the steps under gate-passed are not declared together"),
        (_moved("evaluate_model", "train_model"), "evaluate_model is declared before train_model, which it needs"),
    ],
    ids=[
        "unknown-producer",
        "unknown-switch",
        "unknown-condition",
        "inner-first",
        "unknown-after",
        "twice",
        "condition-apart",
        "before-its-input",
    ],
)
def test_a_declaration_the_renderings_cannot_make_is_refused_in_one_line(declared, said):
    """A contributor's mistakes in the declaration, each found by trying them: every one was accepted (and
    vanished from a rendering, or crashed the KFP compile) or named the wrong thing."""
    with pytest.raises(ValueError) as exc:
        graph.steps(list(graph.SWITCHES), "kfp", declared=declared)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def _load_dag(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"graph_test_{name}", REPO / "dags" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


@pytest.fixture(scope="module", params=["plain", "every_optional_step"])
def dags(request, tmp_path_factory):
    """The three DAGs (local mode) under a config, with the switches it turns on."""
    tmp = tmp_path_factory.mktemp(request.param)
    config: dict[str, Any] = {"data": "raw.csv"}
    on = ["profile"]
    if request.param == "every_optional_step":
        config.update(tune={"workers": 2, "space": SPACE}, optimize={"enabled": True}, require_approval=True)
        on = ["tune", "profile", "optimize", "approval"]
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINPIPE_CONFIG", str(path))
    mp.setenv("TRAINPIPE_AIRFLOW_MODE", "local")
    mp.setenv("AIRFLOW_HOME", str(tmp))
    try:
        yield on, {name: _load_dag(name) for name in ("training_dag", "retrain_dag", "ingest_dag")}
    finally:
        mp.undo()
        for name in list(sys.modules):
            if name.startswith("graph_test_"):
                del sys.modules[name]


#: Each DAG's slice of the graph (retrain's starts after its own gate on the asset event).
SLICES = {
    "training_dag": ({}, {}),
    "retrain_dag": ({"start": "detect_drift"}, {"detect_drift": "new_snapshot"}),
    "ingest_dag": ({"stop": "snapshot_dataset"}, {}),
}


@pytest.mark.parametrize("dag_file", sorted(SLICES))
def test_the_dags_are_the_declared_graph(dags, dag_file):
    on, loaded = dags
    dag = loaded[dag_file]
    bounds, roots = SLICES[dag_file]
    chosen = graph.steps([s for s in on if dag_file != "retrain_dag" or s != "tune"], "airflow", **bounds)
    from trainpipe.pipelines.dag_topology import edges

    want = edges(chosen, roots)
    got = {(up, task.task_id) for task in dag.tasks for up in task.upstream_task_ids}
    assert got == want, f"{dag_file}: rendered but not declared {got - want}; declared but not rendered {want - got}"
    if on == ["profile"]:  # the plain config: the edges as written out by hand, not through edges()
        assert got == WRITTEN_OUT[dag_file], f"{dag_file}: {sorted(got ^ WRITTEN_OUT[dag_file])}"
    gates = {c.task_id for c in graph.CONDITIONS.values() if any(c.name in s.when for s in chosen)}
    gates = {
        g for g in gates if any(c.task_id == g and c.decided_by in dag.task_dict for c in graph.CONDITIONS.values())
    }
    steps = {f"{s.name}_workers" if s.fan_out else s.name for s in chosen} | {s.name for s in chosen}
    assert set(dag.task_dict) == steps | gates | set(roots.values())
    rules = {s.name: s.trigger_rule for s in chosen}
    for task in dag.tasks:
        assert task.trigger_rule == rules.get(task.task_id, "all_success"), task.task_id
    # each gate reads the decision of the step the declaration says decides it, and no other step's
    from types import SimpleNamespace

    decided = {"retrain": True, "reasons": ["drifted"], "decision": {"passed": True, "reasons": ["passed"]}}
    for cond in graph.CONDITIONS.values():
        if cond.task_id in gates:
            gate = dag.task_dict[cond.task_id]
            mine = SimpleNamespace(xcom_pull=lambda task_ids, c=cond: decided if task_ids == c.decided_by else None)
            other = SimpleNamespace(xcom_pull=lambda task_ids, c=cond: None if task_ids == c.decided_by else decided)
            assert gate.condition(ti=mine) is True and not gate.condition(ti=other), cond.task_id


def test_the_declaration_loads_no_orchestrator_or_heavy_library():
    import subprocess

    heavy = ("kfp", "airflow", "torch", "tensorflow", "great_expectations", "dvc", "mlflow")
    code = f"import sys, trainpipe.pipelines.graph; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


#: The reference DAGs' edges under a plain config, written out by hand: the rendering and the test above both
#: go through ``dag_topology.edges``, so a fault in it would pass there; here it cannot.
WRITTEN_OUT = {
    "training_dag": {
        ("validate_data", "snapshot_dataset"),
        ("snapshot_dataset", "detect_drift"),
        ("detect_drift", "retrain"),
        ("retrain", "train_model"),
        ("train_model", "profile_training"),
        ("train_model", "evaluate_model"),
        ("evaluate_model", "gate"),
        ("gate", "register_model"),
        ("profile_training", "register_model"),
    },
    "retrain_dag": {
        ("new_snapshot", "detect_drift"),
        ("detect_drift", "retrain"),
        ("retrain", "train_model"),
        ("train_model", "profile_training"),
        ("train_model", "evaluate_model"),
        ("evaluate_model", "gate"),
        ("gate", "register_model"),
        ("profile_training", "register_model"),
    },
    "ingest_dag": {("validate_data", "snapshot_dataset")},
}


@pytest.mark.parametrize("module", ["training_pipeline", "dag_topology"])
def test_the_renderings_name_no_step(module):
    """Each rendering interprets the declaration and names no step in its code (docstrings aside): what a step is
    (a gate's decider, a fan-out, the approval's tasks, the snapshot's asset, a config section) is data in
    ``STEPS``, so guarding, adding or fanning out a step is one edit there."""
    import ast
    import re

    tree = ast.parse((REPO / "pipelines" / f"{module}.py").read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    texts = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]
    named = {s.name for s in graph.STEPS for t in texts if re.search(rf"\b{s.name}\b", t)}
    assert not named, f"{module}.py names the steps {sorted(named)}: declare what they are in graph.STEPS"


def test_the_two_renderings_stay_small():
    """The renderings are interpreters of the graph: together under 450 lines (what every task is given, the DAG's
    settings and the gates' conditions live beside them, in kfp_tasks, dag_settings and dag_gates)."""
    lines = sum(
        len((REPO / "pipelines" / f).read_text().splitlines()) for f in ("training_pipeline.py", "dag_topology.py")
    )
    assert lines < 450, lines


def test_the_local_build_is_the_cluster_pipeline_without_its_kubernetes_settings(tmp_path):
    """``trainpipe run``'s kfp-local engine builds the pipeline with ``cluster=False``: kfp.local's runners ignore
    the platform spec, and kfp-kubernetes would bring the Kubernetes client into the engine's process. What
    kfp.local does run (the pipeline spec: tasks, inputs, retries, caching, resources, env) must be the same."""
    from kfp import compiler

    from trainpipe.pipelines.training_pipeline import build_pipeline
    from trainpipe.services.profiles import PROFILES

    docs = {}
    for cluster in (True, False):
        out = tmp_path / f"p-{cluster}.yaml"
        compiler.Compiler().compile(build_pipeline(PROFILES["cpu"], cluster=cluster), package_path=str(out))
        docs[cluster] = list(yaml.safe_load_all(out.read_text()))
    assert len(docs[True]) == 2 and docs[True][1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert len(docs[False]) == 1  # no platform spec at all
    assert docs[False][0] == docs[True][0]
