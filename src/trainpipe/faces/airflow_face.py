"""The Airflow 3 side of every component: one operator that runs the entrypoint.

Local mode runs ``python -m trainpipe.components.<name>`` on the worker; Kubernetes
mode runs the same command in a ``KubernetesPodOperator`` with the component image.
One setting (``mode``) switches them. Only transient exit codes are retried: a
failed suite, bad input or a failed gate fails the task for good.
"""

from __future__ import annotations

import functools
import json
from datetime import timedelta
import os
import subprocess
from typing import Any, Callable, ClassVar, Sequence

from airflow.providers.standard.utils.skipmixin import SkipMixin
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from trainpipe.contract.errors import is_retryable_exit
from trainpipe.faces.command import component_command


class TrainpipeOperator(BaseOperator):
    """Run one trainpipe component on the worker; its result JSON is the XCom value.

    Args:
        settings: The component's settings (templated), as its CLI flags take them.
        env: Extra environment of the step (the platform policy; never a secret: those come
            from the worker's own environment or Airflow connections, not from the DAG).
    """

    component: ClassVar[str] = ""
    template_fields: Sequence[str] = ("settings",)
    ui_color = "#e8f4ea"

    def __init__(self, *, settings: dict[str, Any], env: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.env = dict(env or {})

    def asset_extra(self, result: dict[str, Any]) -> dict[str, Any] | None:
        """The extra of the asset events this task emits for its ``outlets`` (none by default)."""
        return None

    def execute(self, context: Any) -> Any:
        cmd = component_command(self.component, self.settings, orchestrator="airflow", run_id=str(context["run_id"]))
        env = dict(os.environ, **self.env, TRAINPIPE_ORCHESTRATOR="airflow")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, check=False)
        for line in proc.stderr.splitlines():
            self.log.info("%s", line)
        if proc.returncode == 0:
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            extra = self.asset_extra(result)
            if extra is not None:
                for asset in self.outlets or []:
                    context["outlet_events"][asset].extra = extra
            return result
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        if is_retryable_exit(proc.returncode):
            raise AirflowException(f"{self.component} exited {proc.returncode} (transient, will retry): {last}")
        raise AirflowFailException(f"{self.component} exited {proc.returncode} (permanent, not retried): {last}")


def pod_settings(profile: Any, resources: Any) -> dict[str, Any]:
    """KubernetesPodOperator arguments from a hardware profile: resources, scheduling, pull
    settings and secrets (by name: Kubernetes injects the values). The restricted security
    context comes from :class:`~trainpipe.faces.airflow_pod.TrainpipePodOperator` itself."""
    from kubernetes.client import models as k8s
    from airflow.providers.cncf.kubernetes.secret import Secret

    settings: dict[str, Any] = {
        "container_resources": k8s.V1ResourceRequirements(**resources.as_k8s()),
        "node_selector": dict(profile.node_selector) or None,
        "tolerations": [k8s.V1Toleration(**t.as_k8s()) for t in profile.tolerations] or None,
        "image_pull_policy": profile.image_pull_policy,
        "image_pull_secrets": [k8s.V1LocalObjectReference(name=n) for n in profile.image_pull_secrets] or None,
        "secrets": [Secret("env", env, secret, key) for secret, keys in sorted(profile.secrets_as_env.items()) for key, env in sorted(keys.items())] or None,
    }
    if profile.service_account:
        settings["service_account_name"] = profile.service_account
    if profile.node_affinity:
        exprs = [k8s.V1NodeSelectorRequirement(**e) for e in profile.node_affinity]
        settings["affinity"] = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=exprs)])))
    return {k: v for k, v in settings.items() if v is not None}


def kubernetes_task(
    component: str, *, task_id: str, settings: dict[str, Any], image: str, namespace: str = "default",
    profile: Any = None, resources: Any = None, **kwargs: Any,
) -> Any:
    """The same command in a pod: ``KubernetesPodOperator`` with the component image and the
    hardware profile's resources, node selector, tolerations, secrets and security context.

    The result JSON goes to ``/airflow/xcom/return.json`` so it becomes the XCom value.
    """
    from trainpipe.faces.airflow_pod import TrainpipePodOperator

    command = component_command(
        component, settings, orchestrator="airflow", run_id="{{ run_id }}", result_path="/airflow/xcom/return.json", python="python"
    )
    if profile is not None:
        kwargs = {**pod_settings(profile, resources or profile.default), **kwargs}
    return TrainpipePodOperator(
        task_id=task_id,
        name=task_id.replace("_", "-"),
        namespace=namespace,
        image=image,
        cmds=command[:3],
        arguments=command[3:],
        do_xcom_push=True,
        get_logs=True,
        **kwargs,
    )


def component_task(
    operator_cls: type[TrainpipeOperator], task_id: str, settings: dict[str, Any], *, mode: str, image: str | None,
    profile: Any = None, resources: Any = None, **kwargs: Any,
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
        return kubernetes_task(operator_cls.component, task_id=task_id, settings=settings, image=image, profile=profile, resources=resources, **kwargs)
    if mode != "local":
        raise ValueError(f"mode: {mode!r} is not local or kubernetes")
    return operator_cls(task_id=task_id, settings=settings, **kwargs)


class GateOperator(BaseOperator, SkipMixin):
    """Continue only when ``condition(**context)`` is truthy (its value is the XCom); otherwise skip
    every task downstream, as ``ShortCircuitOperator`` does.

    Written here, not taken from ``ShortCircuitOperator``, because importing that module (the
    PythonOperator family: virtualenv, pickling, packaging) costs every trainpipe DAG file about
    40 ms of parse time; SkipMixin alone costs 2 ms.
    """

    inherits_from_skipmixin = True
    ui_color = "#f0ede4"

    def __init__(self, *, condition: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.condition = condition

    def execute(self, context: Any) -> Any:
        result = self.condition(**context)
        self.log.info("Condition result is %s", bool(result))
        if not result:
            to_skip = [t for t in context["task"].get_flat_relatives(upstream=False) if not t.is_teardown]
            if to_skip:
                self.log.info("Skipping downstream tasks: %s", ", ".join(sorted(t.task_id for t in to_skip)))
                self.skip(ti=context["ti"], tasks=to_skip)
        return result


def model_steps(step: Any, *, snapshot_dir: str, run_dir: str, train_keys: dict[str, Any]) -> tuple[Any, Any]:
    """train → (profile ∥ evaluate) → gate → register on a snapshot, as both DAGs run them.

    ``step(operator_cls, task_id, settings, **kwargs)`` builds one task in the DAG's mode;
    ``snapshot_dir`` may be a template. Returns the first and the last task.
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
    profile = step(
        ProfileTrainingOperator,
        "profile_training",
        {"model": f"{run_dir}/train_model", "output_dir": f"{run_dir}/profile_training", "tracking_uri": "{{ params.tracking_uri }}"},
    )
    evaluate = step(
        EvaluateModelOperator,
        "evaluate_model",
        {
            "model": f"{run_dir}/train_model",
            "data": snapshot_dir,
            "output_dir": f"{run_dir}/evaluate_model",
            "label_column": "{{ params.label_column }}",
            "thresholds": "{{ params.thresholds | tojson }}",
            "model_name": "{{ params.model_name }}",
            "tracking_uri": "{{ params.tracking_uri }}",
        },
    )
    gate = GateOperator(task_id="gate", condition=gate_passed, doc_md="Continue only when evaluate_model's decision passed.")
    register = step(
        RegisterModelOperator,
        "register_model",
        {
            "model": f"{run_dir}/train_model",
            "decision": f"{run_dir}/evaluate_model",
            "profile": f"{run_dir}/profile_training",
            "output_dir": f"{run_dir}/register_model",
            "model_name": "{{ params.model_name }}",
            "alias": "{{ params.alias }}",
            "tracking_uri": "{{ params.tracking_uri }}",
        },
    )
    train >> [profile, evaluate]
    evaluate >> gate >> register
    profile >> register
    return train, register


def dataset_asset(dataset_name: str) -> Any:
    """The Airflow Asset a dataset's snapshots update (snapshot_dataset emits it with the DVC hash)."""
    from airflow.sdk import Asset

    return Asset(name=f"trainpipe-dataset-{dataset_name}", uri=f"trainpipe://datasets/{dataset_name}", group="trainpipe")


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

    @functools.cached_property
    def profile(self) -> Any:
        """The hardware profile: pods' resources and images (loaded in kubernetes mode only, so a
        local-mode DAG file parses without it)."""
        from trainpipe.profiles import get_profile

        return get_profile(self.config.profile)

    def step(self, operator_cls: type[TrainpipeOperator], task_id: str, settings: dict[str, Any], **kwargs: Any) -> Any:
        """One task in this DAG's mode, with the profile's training or default resources."""
        resources = image = None
        if self.mode == "kubernetes":
            from trainpipe.images import image_for

            resources = self.profile.train if task_id == "train_model" else self.profile.default
            image = image_for(operator_cls.component, accelerated=resources.accelerated)
        if self.config.policy is not None:  # the config's policy travels with every step
            from trainpipe.contract.policy import ENV, to_env

            env = {ENV: to_env(self.config.policy)}
            kwargs["env_vars" if self.mode == "kubernetes" else "env"] = {**env, **kwargs.get("env_vars" if self.mode == "kubernetes" else "env", {})}
        return component_task(operator_cls, task_id, settings, mode=self.mode, image=image, resources=resources,
                              profile=self.profile if self.mode == "kubernetes" else None, **kwargs)

    def params(self, *keys: str) -> dict[str, Any]:
        """DAG params from the config (overridable per run)."""
        c = self.config
        values = {
            "data": c.data, "label_column": c.label_column, "workspace": c.workspace, "suite": c.suite,
            "dataset_name": c.dataset_name, "dvc_repo_dir": c.dvc_repo_dir, "dvc_remote_url": c.dvc_remote_url,
            "tracking_uri": c.tracking_uri, "experiment_name": c.experiment_name, "model_name": c.model_name,
            "alias": c.alias, "thresholds": c.thresholds, "train": c.train.model_dump(),
        }
        return {k: values[k] for k in keys} if keys else values
