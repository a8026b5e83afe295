"""trainpipe's DAGs: the Airflow rendering of the declared graph (:mod:`trainpipe.pipelines.graph`), an interpreter
of its data that names no step: a component's task is its ``<Name>Operator`` in the DAG's mode, a fan-out its
workers mapped over one shared state and then its summary, the approval's steps Airflow's approval task and
``trainpipe promote``, a condition a :class:`GateOperator` after its decider (:mod:`~trainpipe.pipelines.dag_gates`).

``dags/`` are a few lines on top of this: each renders its slice of the graph (:func:`render`) with the settings
of :class:`~trainpipe.pipelines.dag_settings.DagSettings` (the config's settings as the DAG's params, every
task's settings as those params' templates). Nothing here runs at parse time beyond reading the pipeline config.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from trainpipe.contract.imports import import_face
from trainpipe.faces.airflow_operator import GateOperator, TrainpipeOperator
from trainpipe.pipelines import graph
from trainpipe.pipelines.dag_gates import GATE_CONDITIONS, GATES, new_snapshot
from trainpipe.pipelines.dag_settings import RUN_DIR, DagSettings

#: What a DAG file imports from here, beside the rendering (the settings and the retraining DAG's first gate).
__all__ = ["RUN_DIR", "DagSettings", "GateOperator", "edges", "new_snapshot", "operator", "render", "switches"]


def switches(
    include: tuple[str, ...] = graph.DEFAULT_INCLUDE,
    optimizes: bool = False,
    approval_timeout: timedelta | None = None,
    tune: dict[str, Any] | None = None,
) -> list[str]:
    """The optional steps' switches (:data:`~trainpipe.pipelines.graph.SWITCHES`) these settings turn on."""
    return graph.switches(
        tune=bool(tune),
        include=include,
        optimize=optimizes,
        approval=approval_timeout is not None,
    )


def render(
    step: Any,
    chosen: list[graph.Step],
    *,
    snapshot_dir: str,
    run_dir: str,
    asset: Any = None,
    approval_timeout: timedelta | None = None,
    tune: dict[str, Any] | None = None,
    mapped: Any = None,
    roots: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Airflow rendering of the declared graph's ``chosen`` steps (:func:`~trainpipe.pipelines.graph.steps`):
    each step a task in the DAG's mode (``step(operator_cls, task_id, paths, **kwargs)``: :meth:`DagSettings.step`)
    given its inputs as the producers' output folders (the snapshot's is ``snapshot_dir``, which may be a
    template), a fanned-out step its workers (``mapped``: :meth:`DagSettings.mapped`) on its section's settings
    (``tune``: :meth:`PipelineConfig.tune_settings`), each condition a :class:`GateOperator` after the step that
    decides it, wired as :func:`edges` says; ``roots`` maps a step to a task made before it. Returns the tasks
    by id."""
    tasks: dict[str, Any] = {task.task_id: task for task in (roots or {}).values()}
    sections = {"tune": tune or {}}  # the config's sections a fanned-out step's settings come from
    for s in chosen:
        paths = _paths(s, snapshot_dir=snapshot_dir, run_dir=run_dir)
        if s.fan_out is not None:
            tasks[f"{s.name}_workers"], tasks[s.name] = fanned_out(step, mapped, s, sections[str(s.section)], paths)
        elif s.kind != "component":
            tasks[s.name] = _approval(s, chosen, approval_timeout or timedelta(0))
        else:
            if s.held_by_approval and approval_timeout is not None:
                paths["move_alias"] = False
            tasks[s.name] = step(operator(s.name), s.name, paths, **({"outlets": [asset]} if s.asset else {}))
        for cond in graph.CONDITIONS.values():
            if cond.decided_by == s.name and any(cond.name in c.when for c in chosen):
                gate = {**GATES[cond.name], "retries": 0}  # a gate retries nothing: its decision is data
                tasks[cond.task_id] = GateOperator(task_id=cond.task_id, condition=GATE_CONDITIONS[cond.name], **gate)
    roots_ = {k: v.task_id for k, v in (roots or {}).items()}
    for before, after in sorted(edges(chosen, roots_)):
        if after not in tasks[before].downstream_task_ids:
            tasks[before] >> tasks[after]
    return tasks


def _paths(s: graph.Step, *, snapshot_dir: str, run_dir: str) -> dict[str, Any]:
    """A step's artifact paths: the inputs from the steps that are always there, its output folder, then the
    inputs from optional steps (the order its command's flags take)."""

    def where(ref: str) -> str:
        producer = ref.partition(".")[0]
        if ref == graph.RAW:
            return "{{ params.data }}"
        return snapshot_dir if graph.BY_NAME[producer].asset else f"{run_dir}/{producer}"

    artifacts = {k: v for k, v in s.takes.items() if v not in graph.VALUES}
    always = {n for n, declared in graph.BY_NAME.items() if declared.optional is None}
    fixed = {k: where(v) for k, v in artifacts.items() if v == graph.RAW or v.partition(".")[0] in always}
    optional = {k: where(v) for k, v in artifacts.items() if k not in fixed}
    return {**fixed, "output_dir": f"{run_dir}/{s.name}", **optional}


def operator(name: str) -> type[TrainpipeOperator]:
    """A component's Airflow operator: ``<Name>Operator`` in its ``airflow_task``, found by the component's name
    (looked up when a DAG renders, so a DAG loads only the operators of its own steps)."""
    cls: type[TrainpipeOperator] = getattr(import_face(name, "airflow_task"), _camel(name) + "Operator")
    return cls


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def fanned_out(step: Any, mapped: Any, s: graph.Step, section: dict[str, Any], paths: dict[str, Any]) -> list[Any]:
    """A fanned-out step (:class:`~trainpipe.pipelines.graph.FanOut`): its workers, mapped, each with its index and
    ``summarize`` off, on the state they share, then the step that summarizes them. Where the section names no
    shared state, the fan-out's default in the summary's output folder (which the workers share on this
    machine; a database where they run on several)."""
    fan = s.fan_out
    assert fan is not None  # render calls it for a fanned-out step
    out = paths["output_dir"]
    settings = {k: v for k, v in section.items() if k != fan.count and v is not None}
    settings.setdefault(fan.shared, fan.shared_default.format(output_dir=out))
    timeout = {"execution_timeout": timedelta(seconds=fan.timeout_s)}
    workers = mapped(
        operator(s.name),
        f"{s.name}_workers",
        {**paths, "output_dir": f"{out}-worker", **settings, fan.summarize: False},
        [{fan.index: i, "output_dir": f"{out}-worker-{i}"} for i in range(section[fan.count])],
        **timeout,
    )
    return [workers, step(operator(s.name), s.name, {**paths, **settings}, **timeout)]


#: The approval's tasks' descriptions, by the step's kind.
_APPROVAL_DOCS = {
    "approval": "A person approves before the serving alias moves (the config's require_approval).",
    "promote": "`trainpipe promote` with the approver's answer.",
    "reject": "Records a rejection (or the timeout's default) on the version and in the audit log; moves nothing.",
}


def _approval(s: graph.Step, chosen: list[graph.Step], timeout: timedelta) -> Any:
    """One of the approval's tasks, after the step it holds (registering the challenger only): the approval
    (Airflow's ApprovalOperator: a person answers in the UI's Required Actions or through the REST API; "Reject"
    when ``timeout`` passes), the promotion when approved, the record of a rejection when the promotion was
    skipped. Both run ``trainpipe promote`` with the answer: who, and the reason typed into the form, go into the
    version's tags and the audit log."""
    from trainpipe.faces.airflow_operator import PromoteOperator

    held = next(c.name for c in chosen if c.held_by_approval)
    version = "{{ ti.xcom_pull(task_ids='" + held + "')['version'] }}"
    if s.kind == "approval":
        from airflow.sdk import Param

        from trainpipe.faces.airflow_approval import TrainpipeApprovalOperator

        decider = graph.CONDITIONS[s.when[-1]].decided_by  # the gate that let the model this far
        return TrainpipeApprovalOperator(
            task_id=s.name,
            subject=f"Promote {{{{ params.model_name }}}} version {version} to {{{{ params.alias }}}}?",
            body=(
                f"The gate passed: {{{{ ti.xcom_pull(task_ids='{decider}')['decision']['reasons'] | join('; ') }}}}."
                f"\n\n`trainpipe lineage models:/{{{{ params.model_name }}}}/{version}` shows its chain back to the "
                "raw data. Approve to move the serving alias to it; Reject (the default when nobody answers in time) "
                "leaves it a challenger."
            ),
            defaults="Reject",
            response_timeout=timeout,
            execution_timeout=None,
            retries=0,
            params={
                "reason": Param(
                    "", type="string", description="why (goes into the model version's tags and the audit log)"
                )
            },
            doc_md=_APPROVAL_DOCS[s.kind],
        )
    settings = {
        "model_uri": f"models:/{{{{ params.model_name }}}}/{version}",
        "alias": "{{ params.alias }}",
        "tracking_uri": "{{ params.tracking_uri }}",
    }
    return PromoteOperator(
        task_id=s.name,
        settings=settings,
        reject=s.kind == "reject",
        trigger_rule=s.trigger_rule,
        doc_md=_APPROVAL_DOCS[s.kind],
    )


def edges(chosen: list[graph.Step], roots: Mapping[str, str] | None = None) -> set[tuple[str, str]]:
    """The Airflow rendering's edges among ``chosen`` and their conditions' gate tasks: each step after the
    steps it takes from or follows and after its innermost condition's gate, each gate after the step that
    decides it; less every edge another path implies (Airflow's DAGs name the shortest). A fanned-out step is
    its workers (``<name>_workers``), then itself.

    Args:
        chosen: The steps (:func:`steps`).
        roots: Extra edges into the graph (``{"detect_drift": "new_snapshot"}``: a task before a step).
    """
    names = {s.name for s in chosen}
    up: dict[str, set[str]] = {}
    for s in chosen:
        up[s.name] = {p for p in s.producers() if p in names}
        # a condition decided before this graph starts (its step is not in it) has no gate task here
        conds = [graph.CONDITIONS[c] for c in s.when if graph.CONDITIONS[c].decided_by in names]
        if conds:
            up[s.name].add(conds[-1].task_id)
        for cond in conds:
            up.setdefault(cond.task_id, set()).add(cond.decided_by)
    for step, before in (roots or {}).items():
        up.setdefault(step, set()).add(before)
        up.setdefault(before, set())

    def reaches(src: str, dst: str, skip: tuple[str, str]) -> bool:
        todo, seen = [dst], set()
        while todo:
            node = todo.pop()
            for b in up.get(node, ()):
                if (b, node) == skip or b in seen:
                    continue
                if b == src:
                    return True
                seen.add(b)
                todo.append(b)
        return False

    kept = {(b, n) for n, before in up.items() for b in before if not reaches(b, n, (b, n))}
    fanned = {s.name for s in chosen if s.fan_out}  # its workers, then the task that summarizes them
    out = {(b, f"{n}_workers" if n in fanned else n) for b, n in kept}
    return out | {(f"{n}_workers", n) for n in fanned}
