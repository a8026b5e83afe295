"""The topology of trainpipe's DAGs: which tasks, in which mode, wired how, with which params.

``dags/training_dag.py`` and ``dags/retrain_dag.py`` are a few lines on top of this. Nothing here
runs at parse time beyond reading the pipeline config (no database, no connection lookups).
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

from trainpipe.faces.airflow_operator import GateOperator, TrainpipeOperator


def component_task(
    operator_cls: type[TrainpipeOperator],
    task_id: str,
    settings: dict[str, Any],
    *,
    mode: str,
    image: str | None,
    profile: Any = None,
    resources: Any = None,
    **kwargs: Any,
) -> Any:
    """One step in either mode: the operator on the worker (``local``) or the same command in a pod (``kubernetes``)."""
    name = operator_cls.component
    kwargs.setdefault(
        "doc_md",
        f"trainpipe `{name}`: runs `python -m trainpipe.components.{name}` "
        f"({'in a pod with the component image' if mode == 'kubernetes' else 'on the worker'}); its result JSON is the XCom value. "
        "Only transient exits (75, signals) are retried.",
    )
    if mode == "kubernetes":
        from trainpipe.faces.airflow_pod import kubernetes_task

        return kubernetes_task(
            operator_cls.component,
            task_id=task_id,
            settings=settings,
            image=image,
            profile=profile,
            resources=resources,
            operator_cls=operator_cls,
            **kwargs,
        )
    if mode != "local":
        raise ValueError(f"mode: {mode!r} is not local or kubernetes")
    return operator_cls(task_id=task_id, settings=settings, **kwargs)


#: evaluate_model's gate settings, passed from the DAG's params under the same names.
GATE_KEYS = ("thresholds", "min_improvement", "max_regression", "metric_functions", "lower_is_better")


def model_steps(
    step: Any,
    *,
    snapshot_dir: str,
    run_dir: str,
    train_keys: Any,
    include: tuple[str, ...] = ("profile_training",),
    optimize_keys: Any = None,
    approval_timeout: timedelta | None = None,
) -> tuple[Any, Any]:
    """train → (profile ∥ evaluate) → gate → (optimize →) register on a snapshot, as both DAGs run them.

    ``step(operator_cls, task_id, settings, **kwargs)`` builds one task in the DAG's mode;
    ``snapshot_dir`` may be a template; ``include`` names the optional steps (without
    profile_training, register_model records no profile); ``optimize_keys`` (optimize_model's
    settings, from ``params.optimize``) puts optimize_model after the gate, and register_model
    registers its variant beside the model. ``approval_timeout`` (the config's require_approval)
    has register_model register the challenger only, then waits for a person's answer in
    Airflow's approval task: approved, ``promote_model`` moves the alias; rejected or timed out,
    ``record_rejection`` notes it. Returns the first and the last task.
    """
    from trainpipe.components.evaluate_model.airflow_task import EvaluateModelOperator
    from trainpipe.components.profile_training.airflow_task import ProfileTrainingOperator
    from trainpipe.components.register_model.airflow_task import RegisterModelOperator
    from trainpipe.components.train_model.airflow_task import TrainModelOperator

    train = step(
        TrainModelOperator,
        "train_model",
        {
            "data": snapshot_dir,
            "output_dir": f"{run_dir}/train_model",
            "label_column": "{{ params.label_column }}",
            "tracking_uri": "{{ params.tracking_uri }}",
            "experiment_name": "{{ params.experiment_name }}",
            **{k: "{{ params.train.%s | tojson }}" % k for k in train_keys},
        },
        execution_timeout=timedelta(hours=6),
    )
    profile = (
        step(
            ProfileTrainingOperator,
            "profile_training",
            {
                "model": f"{run_dir}/train_model",
                "output_dir": f"{run_dir}/profile_training",
                "tracking_uri": "{{ params.tracking_uri }}",
            },
        )
        if "profile_training" in include
        else None
    )
    evaluate = step(
        EvaluateModelOperator,
        "evaluate_model",
        {
            "model": f"{run_dir}/train_model",
            "data": snapshot_dir,
            "output_dir": f"{run_dir}/evaluate_model",
            "label_column": "{{ params.label_column }}",
            "model_name": "{{ params.model_name }}",
            "champion_alias": "{{ params.alias }}",  # the gate compares with the model that serves under the pipeline's alias
            "tracking_uri": "{{ params.tracking_uri }}",
            **{k: "{{ params.%s | tojson }}" % k for k in GATE_KEYS},
        },
    )
    gate = GateOperator(
        task_id="gate", condition=gate_passed, doc_md="Continue only when evaluate_model's decision passed."
    )
    optimize = None
    if optimize_keys is not None:
        from trainpipe.components.optimize_model.airflow_task import OptimizeModelOperator

        optimize = step(
            OptimizeModelOperator,
            "optimize_model",
            {
                "model": f"{run_dir}/train_model",
                "data": snapshot_dir,
                "output_dir": f"{run_dir}/optimize_model",
                "label_column": "{{ params.label_column }}",
                "seed": "{{ params.train.seed | tojson }}",
                **{k: "{{ params.optimize.%s | tojson }}" % k for k in optimize_keys},
            },
        )
    register = step(
        RegisterModelOperator,
        "register_model",
        {
            "model": f"{run_dir}/train_model",
            "decision": f"{run_dir}/evaluate_model",
            **({"profile": f"{run_dir}/profile_training"} if profile is not None else {}),
            **({"optimized": f"{run_dir}/optimize_model"} if optimize is not None else {}),
            "output_dir": f"{run_dir}/register_model",
            "model_name": "{{ params.model_name }}",
            "alias": "{{ params.alias }}",
            "tracking_uri": "{{ params.tracking_uri }}",
            **({"move_alias": False} if approval_timeout is not None else {}),
        },
    )
    last = register if approval_timeout is None else approval_steps(register, approval_timeout)
    train >> [t for t in (profile, evaluate) if t is not None]
    evaluate >> gate >> (optimize if optimize is not None else register)
    if optimize is not None:
        optimize >> register
    if profile is not None:
        profile >> register
    return train, last


def approval_steps(register: Any, timeout: timedelta) -> Any:
    """register_model (challenger only) → approve (Airflow's ApprovalOperator: a person answers in
    the UI's Required Actions or through the REST API; "Reject" when ``timeout`` passes) →
    promote_model (approved) → record_rejection (runs only when promote_model was skipped). Both
    run ``trainpipe promote`` with the answer: who, and the reason typed into the form, go into the
    version's tags and the audit log. Returns the last task."""
    from airflow.sdk import Param

    from trainpipe.faces.airflow_approval import TrainpipeApprovalOperator
    from trainpipe.faces.airflow_operator import PromoteOperator

    version = "{{ ti.xcom_pull(task_ids='register_model')['version'] }}"
    approve = TrainpipeApprovalOperator(
        task_id="approve",
        subject=f"Promote {{{{ params.model_name }}}} version {version} to {{{{ params.alias }}}}?",
        body=(
            "The gate passed: {{ ti.xcom_pull(task_ids='evaluate_model')['decision']['reasons'] | join('; ') }}.\n\n"
            f"`trainpipe lineage models:/{{{{ params.model_name }}}}/{version}` shows its chain back to the raw data. "
            "Approve to move the serving alias to it; Reject (the default when nobody answers in time) leaves it a challenger."
        ),
        defaults="Reject",
        response_timeout=timeout,
        execution_timeout=None,
        retries=0,
        params={
            "reason": Param("", type="string", description="why (goes into the model version's tags and the audit log)")
        },
        doc_md="A person approves before the serving alias moves (the config's require_approval).",
    )
    settings = {
        "model_uri": f"models:/{{{{ params.model_name }}}}/{version}",
        "alias": "{{ params.alias }}",
        "tracking_uri": "{{ params.tracking_uri }}",
    }
    promote = PromoteOperator(
        task_id="promote_model", settings=settings, doc_md="`trainpipe promote` with the approver's answer."
    )
    rejected = PromoteOperator(
        task_id="record_rejection",
        settings=settings,
        reject=True,
        trigger_rule="all_skipped",
        doc_md="Records a rejection (or the timeout's default) on the version and in the audit log; moves nothing.",
    )
    register >> approve >> promote >> rejected
    return rejected


def drift_steps(
    step: Any, *, snapshot_dir: str, run_dir: str, retrain_on: str | None = "{{ params.retrain_on }}"
) -> tuple[Any, Any]:
    """detect_drift on a snapshot, then the gate that lets the model steps run only when it says
    to retrain. ``retrain_on`` None leaves detect_drift's own (drift). Returns both tasks."""
    from trainpipe.components.detect_drift.airflow_task import DetectDriftOperator

    detect = step(
        DetectDriftOperator,
        "detect_drift",
        {
            "data": snapshot_dir,
            "output_dir": f"{run_dir}/detect_drift",
            "label_column": "{{ params.label_column }}",
            "model_name": "{{ params.model_name }}",
            "champion_alias": "{{ params.alias }}",  # drift against the data of the model that serves under the pipeline's alias
            "tracking_uri": "{{ params.tracking_uri }}",
            "drift_share": "{{ params.drift_share | tojson }}",
            "max_champion_age_days": "{{ params.max_champion_age_days | tojson }}",
            "seed": "{{ params.train.seed | tojson }}",
            **({"retrain_on": retrain_on} if retrain_on else {}),
        },
    )
    decide = GateOperator(
        task_id="retrain",
        condition=drift_says_retrain,
        retries=0,
        doc_md="Continue only when detect_drift decided to retrain; a skip logs why in one line.",
    )
    detect >> decide
    return detect, decide


def drift_says_retrain(ti: Any = None, **_: Any) -> bool:
    """Gate condition: detect_drift's decision. The reason goes into the task log as one line (the
    audit log has detect_drift's own record of it)."""
    result = ti.xcom_pull(task_ids="detect_drift") or {}
    retrain = bool(result.get("retrain"))
    reason = (result.get("reasons") or ["detect_drift returned no decision"])[0]
    print(f"trainpipe: {'retraining' if retrain else 'not retraining'}: {reason}", flush=True)  # the task log
    return retrain


def dataset_asset(dataset_name: str) -> Any:
    """The Airflow Asset a dataset's snapshots update (snapshot_dataset emits it with the DVC hash)."""
    from airflow.sdk import Asset

    return Asset(
        name=f"trainpipe-dataset-{dataset_name}", uri=f"trainpipe://datasets/{dataset_name}", group="trainpipe"
    )


def new_snapshot(triggering_asset_events: Any = None, **_: Any) -> str | bool:
    """Gate condition of the retraining DAG: the newest triggering snapshot's directory
    when its content hash is new (the snapshot committed new data), else False (skip)."""
    events = [e for evs in (triggering_asset_events or {}).values() for e in evs]
    if not events:
        return False
    extra = dict(events[-1].extra or {})
    if not extra.get("changed") or not extra.get("snapshot_dir"):
        return False
    return str(extra["snapshot_dir"])


def gate_passed(ti: Any = None, **_: Any) -> bool:
    """Gate condition: True when evaluate_model's decision passed."""
    result = ti.xcom_pull(task_ids="evaluate_model")
    return bool(result and result.get("decision", {}).get("passed"))


#: Retries with a capped exponential backoff and a timeout on every task of trainpipe's DAGs.
DEFAULT_ARGS: dict[str, Any] = {
    "retries": 3,
    "retry_delay": timedelta(seconds=10),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": timedelta(hours=1),
}

#: Where one DAG run keeps its step outputs.
RUN_DIR = "{{ params.workspace }}/airflow-runs/{{ run_id | replace(':', '_') | replace('+', '_') }}"


class DagSettings:
    """What a trainpipe DAG file reads at parse time: the pipeline config named by
    ``TRAINPIPE_CONFIG`` (a small YAML file; no database or connection lookups), the mode
    (``TRAINPIPE_AIRFLOW_MODE``: local or kubernetes) and the hardware profile; each task's image
    comes from :mod:`trainpipe.images`."""

    def __init__(self) -> None:
        from trainpipe.pipelines.config import PipelineConfig, load_pipeline_config

        path = os.environ.get("TRAINPIPE_CONFIG")
        self.config = load_pipeline_config(path) if path else PipelineConfig(data="data.csv").resolved()
        self.mode = os.environ.get("TRAINPIPE_AIRFLOW_MODE", "local")
        if self.config.policy is not None:
            self.config.check_policy()  # at parse time, as the KFP compiler does: a broken DAG names the setting

    @property
    def approval_timeout(self) -> timedelta | None:
        """How long the approval task waits (the config's require_approval), or None: no approval step."""
        return timedelta(hours=self.config.approval_timeout_hours) if self.config.require_approval else None

    @functools.cached_property
    def profile(self) -> Any:
        """The hardware profile: pods' resources and images in kubernetes mode, Celery queues in both."""
        from trainpipe.profiles import get_profile

        return get_profile(self.config.profile)

    def step(self, operator_cls: type[TrainpipeOperator], task_id: str, settings: dict[str, Any], **kwargs: Any) -> Any:
        """One task in this DAG's mode, with the profile's training or default resources, on the
        profile's Celery queue (training on its own: the workers on the training machines serve it)."""
        kwargs.setdefault("queue", self.profile.train_queue if task_id == "train_model" else self.profile.queue)
        resources = image = None
        if self.mode == "kubernetes":
            from trainpipe.images import image_for

            resources = self.profile.train if task_id == "train_model" else self.profile.default
            image = image_for(operator_cls.component, accelerated=resources.accelerated)
        env: dict[str, str] = {}
        if self.config.policy is not None:  # the config's policy travels with every step
            from trainpipe.contract.policy import ENV, to_env

            env[ENV] = to_env(self.config.policy)
        if (
            task_id in ("evaluate_model", "optimize_model") and self.config.trusted_code()
        ):  # they rebuild the team's model from its code
            env["TRAINPIPE_TRUSTED_MODEL_CODE"] = self.config.trusted_code()
        if env:
            key = "env_vars" if self.mode == "kubernetes" else "env"
            kwargs[key] = {**env, **kwargs.get(key, {})}
        return component_task(
            operator_cls,
            task_id,
            settings,
            mode=self.mode,
            image=image,
            resources=resources,
            profile=self.profile if self.mode == "kubernetes" else None,
            **kwargs,
        )

    def params(self, *keys: str) -> dict[str, Any]:
        """DAG params from the config (overridable per run)."""
        c = self.config
        values = {
            "data": c.data,
            "label_column": c.label_column,
            "workspace": c.workspace,
            "suite": c.suite,
            "dataset_name": c.dataset_name,
            "dvc_repo_dir": c.dvc_repo_dir,
            "dvc_remote_url": c.dvc_remote_url,
            "tracking_uri": c.tracking_uri,
            "experiment_name": c.experiment_name,
            "model_name": c.model_name,
            "alias": c.alias,
            **{k: getattr(c, k) for k in GATE_KEYS},
            "train": c.train.model_dump(mode="json"),
            "retrain_on": c.retrain_on,
            "drift_share": c.drift_share,
            "max_champion_age_days": c.max_champion_age_days,
            "optimize": c.optimize.settings(),
        }
        return {k: values[k] for k in keys} if keys else values
