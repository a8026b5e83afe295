"""The reference training pipeline (KFP v2): the KFP rendering of the graph declared in
:mod:`trainpipe.pipelines.graph` (which the Airflow DAGs render too), an interpreter of its data that names no
step: each step a task of its component's KFP face, a condition a ``dsl.If`` on its decider's output, a
fanned-out step its workers in a ``dsl.ParallelFor`` and then its summary, a section's settings compiled in.

validate → snapshot → detect drift → if retraining: train → (profile ∥ evaluate) → if the gate passed:
(optimize →) register. Every task has a retry policy with exponential backoff, a timeout, and the resources of
one hardware profile (:mod:`trainpipe.pipelines.kfp_tasks`). Importing this module loads kfp only.
"""

# No `from __future__ import annotations`: KFP reads the real annotations.

import json
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset

from trainpipe.contract.imports import import_face
from trainpipe.faces.kfp_face import accelerated
from trainpipe.faces.surface import REQUIRED, KfpParam, kfp_params
from trainpipe.pipelines import graph
from trainpipe.pipelines.kfp_tasks import bind, configure, pipeline_function, run_parameter
from trainpipe.services.profiles import PROFILES, HardwareProfile
from trainpipe.services.profiles import to_env as profile_env

PIPELINE_NAME = "trainpipe-training"


def face(name: str, accelerator: bool = False) -> Any:
    """A step's KFP component: its component's face (``kfp_component.<name>``), in the accelerated image when asked."""
    component = getattr(import_face(name, "kfp_component"), name)
    return accelerated(component) if accelerator else component


def section_settings(
    s: graph.Step, section: dict[str, Any], p: dict[str, Any], trust: dict[str, Any]
) -> tuple[dict[str, Any], list[KfpParam]]:
    """A step's settings from its config section, compiled in: the set ones (a JSON-text setting as JSON, the
    fan-out's worker count left out), the step's trusted packages with the team's once, and one left to the run
    (``REQUIRED``) as the run's parameter (:func:`run_parameter`). Returns the settings and those parameters."""
    params = getattr(import_face(s.name, "spec"), "".join(w.title() for w in s.name.split("_")) + "Params")
    text = {q.name for q in kfp_params(params) if q.json_text}
    count = s.fan_out.count if s.fan_out else None
    settings = {k: json.dumps(v) if k in text else v for k, v in section.items() if k != count and v is not None}
    if "trust" in s.given and ("trusted_packages" in settings or trust):
        packages = [*settings.pop("trusted_packages", []), *trust.get("trusted_packages", [])]
        settings["trusted_packages"] = list(dict.fromkeys(packages))
    late = [run_parameter(s.name, str(s.section), k, params) for k, v in settings.items() if v is REQUIRED]
    for param in late:
        settings[param.name.removeprefix(f"{s.section}_")] = p.get(param.name, REQUIRED)
    return settings, late


def _fanned_out(s: graph.Step, component: Any, p: dict[str, Any], given: dict[str, Any], count: int) -> list[Any]:
    """A fanned-out step's workers in a ``dsl.ParallelFor`` on one shared state, then the step that summarizes it."""
    fan = s.fan_out
    assert fan is not None  # called for a fanned-out step
    with dsl.ParallelFor(items=list(range(count)), name=f"{s.section}-workers", parallelism=count) as i:
        worker = bind(component, p, **given, **{fan.index: i, fan.summarize: False})
    return [worker, bind(component, p, **given, **{fan.summarize: True}).after(worker)]


def _output(made: dict[str, list[Any]], ref: str) -> Any:
    """The output ``<step>.<name>`` of the task a step made (a fanned-out step's summary)."""
    step, _, name = ref.partition(".")
    return made[step][-1].outputs[name]


def build_pipeline(
    profile: HardwareProfile,
    policy: Any = None,
    pipeline_root: str | None = None,
    trusted_code: str = "",
    include: tuple[str, ...] = graph.DEFAULT_INCLUDE,
    optimize: dict[str, Any] | None = None,
    require_approval: bool = False,
    tune: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    cluster: bool = True,
) -> Any:
    """The reference pipeline with one hardware profile's settings.

    Args:
        profile: Resources, scheduling and retries of every step.
        policy: A non-empty :class:`~trainpipe.contract.policy.Policy` goes onto every task as
            ``TRAINPIPE_POLICY`` (rules only: it holds no secret).
        pipeline_root: Where KFP keeps the run's artifacts (default: the cluster's).
        trusted_code: A team's package the steps that rebuild its model may import (their
            ``trusted_packages`` setting).
        include: The optional steps to run (``profile_training``; without it, register_model
            records no training profile).
        optimize: optimize_model's settings: with them, it runs between the gate and register_model,
            which registers its accepted variant beside the model (``<model_name>-onnx``).
        require_approval: register_model registers the challenger only (KFP has no human step:
            ``trainpipe promote`` moves the serving alias after a person approves).
        tune: tune_model's settings and ``workers`` (:meth:`PipelineConfig.tune_settings`): with
            them, ``workers`` tune_model tasks share one study in a ``dsl.ParallelFor``, one more
            summarizes it, and train_model takes the best trial's settings (its ``tuned`` input).
            A ``storage`` of ``REQUIRED`` is the run's parameter ``tune_storage`` (:func:`section_settings`).
        defaults: The pipeline parameters' defaults a config compiles in (KFP values by parameter name,
            :data:`~trainpipe.faces.surface.REQUIRED` for one a run must pass); the others keep the specs'.
        cluster: False for a run on ``kfp.local``: the same graph, settings and retries, without the
            Kubernetes platform settings its runners ignore (:func:`~trainpipe.pipelines.kfp_tasks.configure`).
    """
    from trainpipe.contract.policy import to_env

    policy_json = to_env(policy) if policy is not None else "{}"
    on = graph.switches(
        tune=tune is not None,
        include=include,
        optimize=optimize is not None,
        approval=require_approval,
    )
    chosen = graph.steps(on, "kfp")
    faces = {s.name: face(s.name, s.trains and profile.train.accelerated) for s in chosen}
    trust = {"trusted_packages": [trusted_code]} if trusted_code else {}  # the steps that rebuild its model
    sections = {"tune": tune or {}, "optimize": optimize or {}}
    # a section's settings are compiled in; one left to the run (REQUIRED) is a run parameter
    late = [q for s in chosen if s.section for q in section_settings(s, sections[s.section], {}, trust)[1]]

    def steps(p: dict[str, Any]) -> None:
        raw = dsl.importer(artifact_uri=p["data"], artifact_class=Dataset, reimport=False)
        raw.set_display_name("raw-data")
        made: dict[str, list[Any]] = {}  # each step's tasks (a fanned-out one: its workers, then the summary)
        branches: list[tuple[str, Any]] = []  # the open dsl.If contexts, outermost first
        for s in chosen:
            while [name for name, _ in branches] != list(s.when[: len(branches)]):  # leave the branches it is not in
                branches.pop()[1].__exit__(None, None, None)
            for name in s.when[len(branches) :]:  # the step's conditions not open yet: after their deciders
                decided = made[graph.CONDITIONS[name].decided_by][-1].outputs["Output"]
                branch = dsl.If(decided == True, name=name)  # noqa: E712 (KFP condition syntax)
                branch.__enter__()
                branches.append((name, branch))
            given = {k: raw.output if v == graph.RAW else _output(made, v) for k, v in s.takes.items()}
            given = {**given, "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER, **(trust if "trust" in s.given else {})}
            if s.section:
                given.update(section_settings(s, sections[s.section], p, trust)[0])
            if s.held_by_approval:  # no run parameter can skip the approval
                given["move_alias"] = not require_approval
            if s.fan_out:
                made[s.name] = _fanned_out(s, faces[s.name], p, given, sections[str(s.section)][s.fan_out.count])
            else:
                made[s.name] = [bind(faces[s.name], p, **given)]
        while branches:
            branches.pop()[1].__exit__(None, None, None)
        configure(chosen, made, profile, profile_env(profile), policy_json, cluster=cluster)

    description = "Validate, snapshot, check drift, train, profile, evaluate and register a model."
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=pipeline_root)(
        pipeline_function(steps, description, defaults, extra=tuple(late))
    )


def __getattr__(name: str) -> Any:
    """``training_pipeline``: the pipeline with the CPU profile (what ``trainpipe compile`` emits by default), built
    when first asked for, not at import: the local engine builds its own, and a build costs a second."""
    if name != "training_pipeline":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = globals()["training_pipeline"] = build_pipeline(PROFILES["cpu"])
    return built
