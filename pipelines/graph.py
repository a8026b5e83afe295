"""The reference pipeline's graph, declared once: its steps, the artifacts each takes from which step, the
conditions they run under, the optional steps and what each step is given.

The KFP pipeline (:mod:`trainpipe.pipelines.training_pipeline`) and the Airflow DAGs
(:mod:`trainpipe.pipelines.dag_topology`, ``dags/``) are renderings of :data:`STEPS`, as Dagster's one
definition runs on any executor; ``tests/contract/test_graph.py`` holds each rendering to it (the compiled
YAML's edges and conditions, the DagBag's edges and trigger rules). Adding, guarding or reordering a step is
one edit here (docs/layout.md shows one). Plain data: importing it loads neither kfp nor airflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: The pipeline's own input: the raw data's URI (KFP imports it as an artifact; a DAG reads ``params.data``).
RAW = "@data"


@dataclass(frozen=True)
class Condition:
    """A branch: the steps under it run only when ``decided_by``'s decision says so.

    Attributes:
        name: The KFP ``dsl.If`` name.
        task_id: The Airflow gate task's id.
        decided_by: The step whose decision it reads (KFP: its ``Output``; Airflow: its result's XCom).
    """

    name: str
    task_id: str
    decided_by: str


@dataclass(frozen=True)
class FanOut:
    """A step run as parallel workers on one shared state, then once more to summarize them (tune_model: its
    workers on one Optuna study, then the summary whose best settings the training takes).

    Attributes:
        count: Its section's setting that says how many workers (not a setting of the step itself).
        index: The setting each worker gets its number in.
        summarize: The boolean setting that is off in the workers and on in the summary.
        shared: The setting that names the state the workers share.
        shared_default: Where an Airflow run keeps that state when the section names none (``{output_dir}``:
            the summary's output folder), which the workers share on one machine.
        timeout_s: An Airflow task's timeout for the workers and the summary.
    """

    count: str
    index: str
    summarize: str
    shared: str
    shared_default: str
    timeout_s: int


#: What a step can be: a trainpipe component (its KFP face and its Airflow operator), a person's answer
#: (Airflow's approval task; KFP has none: ``trainpipe promote`` does it there), the promotion that answer
#: decides (``trainpipe promote``) or the record of a rejection (``trainpipe promote --reject``).
KINDS = ("component", "approval", "promote", "reject")


@dataclass(frozen=True)
class Step:
    """One step of the reference pipeline.

    Attributes:
        name: The component (its folder), the KFP task and the Airflow task id.
        takes: Each input the step takes from another step, as ``"<step>.<output>"`` (or :data:`RAW`). Airflow
            passes an artifact as the producer's output folder; a value (:data:`VALUES`) only KFP passes.
        when: The conditions it runs under, outermost first.
        optional: The switch that puts it in the pipeline (:data:`SWITCHES`); None: always there.
        given: What it is given besides its settings and inputs: ``profile`` (the hardware profile's
            content), ``trust`` (the team's package among its trusted packages). Every step gets the policy.
        after: Steps it follows without taking their output.
        cached: Whether KFP may reuse an earlier run's result (the ones that read what changes behind one
            URI, and the registration, are never cached).
        trains: It takes the profile's training resources, timeout and queue.
        fan_out: It runs as parallel workers on one shared state, then one summarizing task (:class:`FanOut`).
        held_by_approval: With approval, it registers the challenger only (``move_alias`` false).
        kind: What it is (:data:`KINDS`): a component, or one of the approval's tasks.
        section: The pipeline config's section that holds its settings beyond the pipeline's parameters
            (``optimize``, ``tune``): KFP compiles them in, a DAG passes them from that nested param.
        asset: Its output is the dataset's snapshot: Airflow's rendering emits the dataset's Asset from it (the
            retraining DAG listens), and a later step reads the snapshot folder the DAG names (the retraining
            DAG's comes from the triggering event).
        engines: The renderings it is in (KFP has no human step: ``trainpipe promote`` does it there).
        trigger_rule: When it runs given the steps before it (Airflow's trigger rule; default: all succeeded).
    """

    name: str
    takes: Mapping[str, str] = field(default_factory=dict)
    when: tuple[str, ...] = ()
    optional: str | None = None
    given: frozenset[str] = frozenset()
    after: tuple[str, ...] = ()
    cached: bool = True
    trains: bool = False
    fan_out: FanOut | None = None
    held_by_approval: bool = False
    kind: str = "component"
    section: str | None = None
    asset: bool = False
    engines: frozenset[str] = frozenset({"kfp", "airflow"})
    trigger_rule: str = "all_success"

    def producers(self) -> list[str]:
        """The steps it takes an input from, then those it follows, in order."""
        taken = [ref.partition(".")[0] for ref in self.takes.values() if ref != RAW]
        return list(dict.fromkeys([*taken, *self.after]))


#: The optional steps' switches: the pipeline config's setting that turns each on.
SWITCHES = {
    "tune": "tune (tune_model's settings and workers)",
    "profile": "profile_training in `include` (default on)",
    "optimize": "optimize.enabled, else the hardware profile's optimize",
    "approval": "require_approval",
}

#: The outputs that are values, not artifacts: KFP passes the snapshot's content hash into every later
#: data-consuming task's cache key; an Airflow step reads the snapshot's folder instead.
VALUES = frozenset({"snapshot_dataset.md5"})

RETRAIN = Condition("retrain", "retrain", decided_by="detect_drift")
GATE_PASSED = Condition("gate-passed", "gate", decided_by="evaluate_model")
CONDITIONS = {c.name: c for c in (RETRAIN, GATE_PASSED)}
#: The conditions, outermost first (the order a step lists those it runs under).
OUTERMOST_FIRST = [RETRAIN.name, GATE_PASSED.name]

#: tune_model's workers share one Optuna study (SQLite in the run's folder on one machine, PostgreSQL on several).
_STUDY = FanOut("workers", "worker", "summarize", "storage", "sqlite:///{output_dir}/study.db", 12 * 3600)
_SNAPSHOT = {"data": "snapshot_dataset.snapshot", "dataset_md5": "snapshot_dataset.md5"}
_RETRAIN = (RETRAIN.name,)
_GATED = (RETRAIN.name, GATE_PASSED.name)

#: The reference pipeline, in the order its tasks are made.
STEPS: tuple[Step, ...] = (
    Step("validate_data", takes={"data": RAW}, cached=False),
    Step("snapshot_dataset", takes={"data": "validate_data.validated"}, cached=False, asset=True),
    Step("detect_drift", takes=_SNAPSHOT, given=frozenset({"trust"}), cached=False),
    Step(
        "tune_model",
        takes=_SNAPSHOT,
        when=_RETRAIN,
        optional="tune",
        given=frozenset({"profile"}),
        fan_out=_STUDY,
        section="tune",
    ),
    Step(
        "train_model",
        takes={**_SNAPSHOT, "tuned": "tune_model.study"},
        when=_RETRAIN,
        given=frozenset({"profile"}),
        trains=True,
    ),
    Step(
        "profile_training",
        takes={"model": "train_model.model"},
        when=_RETRAIN,
        optional="profile",
        given=frozenset({"profile"}),
    ),
    Step(
        "evaluate_model", takes={"model": "train_model.model", **_SNAPSHOT}, when=_RETRAIN, given=frozenset({"trust"})
    ),
    Step(
        "optimize_model",
        takes={"model": "train_model.model", **_SNAPSHOT},
        when=_GATED,
        optional="optimize",
        given=frozenset({"trust"}),
        section="optimize",
    ),
    Step(
        "register_model",
        takes={
            "model": "train_model.model",
            "decision": "evaluate_model.decision",
            "training_profile": "profile_training.training_profile",
            "optimized": "optimize_model.optimized",
        },
        when=_GATED,
        cached=False,
        held_by_approval=True,
    ),
    Step(
        "approve",
        after=("register_model",),
        when=_GATED,
        optional="approval",
        engines=frozenset({"airflow"}),
        kind="approval",
    ),
    Step(
        "promote_model",
        after=("approve",),
        when=_GATED,
        optional="approval",
        engines=frozenset({"airflow"}),
        kind="promote",
    ),
    Step(
        "record_rejection",
        after=("promote_model",),
        when=_GATED,
        optional="approval",
        engines=frozenset({"airflow"}),
        kind="reject",
        trigger_rule="all_skipped",  # the answer was no, or nobody answered: promote_model was skipped
    ),
)

BY_NAME = {s.name: s for s in STEPS}
#: The optional steps a rendering includes unless told otherwise (its ``include``): those on the profile switch.
DEFAULT_INCLUDE = tuple(s.name for s in STEPS if s.optional == "profile")


def check(declared: tuple[Step, ...]) -> None:
    """Refuse a declaration the renderings cannot make, each mistake in one line naming the step: a name declared
    twice; an input from, or an ``after`` of, no declared step; an unknown condition or switch; conditions not
    listed outermost first; a step before a step it takes from, follows, or whose decision it waits for (the
    renderings make the tasks in the declared order); a condition's steps not declared together (KFP opens one
    ``dsl.If`` for them)."""
    names = [s.name for s in declared]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{twice[0]} is declared twice: each step once")
    seen: set[str] = set()
    for s in declared:
        _check_step(s, set(names))
        needed = [*s.producers(), *(CONDITIONS[c].decided_by for c in s.when)]
        late = [n for n in needed if n not in seen]
        if late:
            raise ValueError(f"{s.name} is declared before {', '.join(late)}, which it needs: move it after them")
        seen.add(s.name)
    for cond in CONDITIONS:
        under = [i for i, s in enumerate(declared) if cond in s.when]
        apart = [declared[i].name for i in range(under[0], under[-1] + 1) if i not in under] if under else []
        if apart:
            raise ValueError(
                f"the steps under {cond} are not declared together: {apart[0]}, which is not under it, is among "
                "them (declare it before or after them)"
            )


def _check_step(s: Step, names: set[str]) -> None:
    """One step's own references: its inputs' and ``after``'s steps, its conditions, its switch."""
    for key, ref in s.takes.items():
        producer, _, output = ref.partition(".")
        if ref != RAW and (producer not in names or not output):
            raise ValueError(
                f"{s.name} takes {key} from {ref!r}: no declared step is named {producer!r} (write <step>.<output>)"
            )
    for before in s.after:
        if before not in names:
            raise ValueError(f"{s.name} follows {before!r}: no declared step has that name")
    unknown = [c for c in s.when if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"{s.name} runs when {unknown[0]!r}: no such condition (conditions: {', '.join(CONDITIONS)})")
    outermost_first = sorted(s.when, key=OUTERMOST_FIRST.index)
    if list(s.when) != outermost_first:
        raise ValueError(f"{s.name} lists its conditions inner first: write ({', '.join(outermost_first)})")
    if s.optional is not None and s.optional not in SWITCHES:
        raise ValueError(f"{s.name} is optional on {s.optional!r}: no such switch (switches: {', '.join(SWITCHES)})")
    if s.kind not in KINDS:
        raise ValueError(f"{s.name} is a {s.kind!r}: no such kind of step (kinds: {', '.join(KINDS)})")


def switches(
    *, tune: bool, optimize: bool, approval: bool, profile: bool | None = None, include: Iterable[str] = ()
) -> list[str]:
    """The switches (:data:`SWITCHES`) that are on, by name; ``profile`` unless told: whether ``include`` names a
    step on it."""
    if profile is None:
        profile = any(n in BY_NAME and BY_NAME[n].optional == "profile" for n in include)
    flags = {"tune": tune, "profile": profile, "optimize": optimize, "approval": approval}
    return [name for name, flag in flags.items() if flag]


def steps(
    switches: Iterable[str],
    engine: str,
    start: str | None = None,
    stop: str | None = None,
    declared: tuple[Step, ...] = STEPS,
) -> list[Step]:
    """The steps one rendering makes: those of ``engine`` whose switch is on, from ``start`` to ``stop``
    (inclusive; default: all), with the inputs from steps that are off dropped. ``declared``: another
    declaration than :data:`STEPS` (what an edit to it would render)."""
    check(declared)
    on = set(switches)
    names = [s.name for s in declared]
    first = names.index(start) if start else 0
    last = names.index(stop) if stop else len(names) - 1
    chosen = [s for s in declared[first : last + 1] if engine in s.engines and (s.optional is None or s.optional in on)]
    present = {s.name for s in declared if engine in s.engines and (s.optional is None or s.optional in on)}
    out = []
    for s in chosen:
        takes = {k: v for k, v in s.takes.items() if v == RAW or v.partition(".")[0] in present}
        out.append(Step(**{**s.__dict__, "takes": takes}))
    return out
